//! Sources and replies: the source-address check, addresses no host sends from, and the
//! per-client reply limit.

use super::*;

impl Switch {
    /// With `switch.source_check`: whether the frame's IPv4 source (the IPv4 header's, or an
    /// ARP sender's) may come from `in_port`. The local port is the switch's own host and is
    /// not checked; the switch's own addresses come from nowhere else (but the VIP in l2 mode,
    /// which the servers own, from a server's MAC).
    pub(super) fn check_source(
        &mut self,
        in_port: u16,
        frame: &[u8],
        src_mac: Mac,
        ethertype: EtherType,
        now: Instant,
    ) -> Option<Drop> {
        if self.guard.is_none() || Some(in_port) == self.local {
            return None;
        }
        let (ethertype, at) = beneath_tags(frame, ethertype)?;
        let ip = match ethertype {
            EtherType::IPV4 => {
                let at = at + usize::from(OFF_IP_SRC) - ethernet::HEADER_LEN;
                let bytes: [u8; 4] = frame.get(at..at + 4)?.try_into().ok()?;
                Ipv4Addr::from(bytes)
            }
            EtherType::ARP => {
                let packet = arp::Packet::new_checked(frame.get(at..)?).ok()?;
                arp::Repr::parse(&packet).ok()?.sender_ip
            }
            _ => return None,
        };
        if self.own_address(ip) {
            let server = self.backend_macs.contains(&Some(src_mac));
            if self.spec.mode == Mode::L2 && ip == self.spec.vip.ip && server {
                return None;
            }
            return Some(Drop::SourceVip);
        }
        if !source::is_host_address(ip) {
            return None;
        }
        if self.sent_back(in_port, frame, src_mac) {
            return None;
        }
        // A server's address belongs to its port for as long as it is in the pool, silent or
        // not: a client cannot take it over while the server is idle.
        if let Some(port) = self.server_ip_port(ip) {
            return (port != in_port).then_some(Drop::SourceSpoofed);
        }
        match self.guard.as_mut()?.check(in_port, ip, now) {
            Check::Accept => None,
            Check::Spoofed => Some(Drop::SourceSpoofed),
            Check::TableFull => Some(Drop::SourceTableFull),
        }
    }

    /// Whether `frame` is a read a SwitchKV cache node sends back through the switch (the
    /// other prefix in its destination MAC; IPv4 with a plain header, UDP to the VIP's
    /// memcached port), from the port and MAC of an interface-table entry that `kv_steer`
    /// entries send reads through (a cache node's): it keeps its client's address, which is
    /// neither checked nor learned on that port.
    fn sent_back(&self, in_port: u16, frame: &[u8], src_mac: Mac) -> bool {
        let Some(dst) = frame.get(0..6).and_then(|b| <[u8; 6]>::try_from(b).ok()) else {
            return false;
        };
        if !keymac::is_other(Mac(dst)) {
            return false;
        }
        let ipv4_udp = frame.get(12..14) == Some(&EtherType::IPV4.0.to_be_bytes()[..])
            && frame.get(ethernet::HEADER_LEN) == Some(&0x45)
            && frame.get(usize::from(OFF_IP_PROTO)) == Some(&ipv4::Protocol::UDP.0);
        let at = usize::from(OFF_IP_DST);
        let dst_port = usize::from(OFF_L4_DST);
        if !ipv4_udp
            || frame.get(at..at + 4) != Some(&self.spec.vip.ip.octets()[..])
            || frame.get(dst_port..dst_port + 2) != Some(&self.spec.vip.port.to_be_bytes()[..])
        {
            return false;
        }
        self.steer_hops.iter().any(|&i| {
            self.pipeline
                .interface(i)
                .is_some_and(|it| it.port == in_port && it.eth_dst == src_mac.0)
        })
    }

    /// The VIP, the agent address, or an address of the host's end of the local port.
    pub(super) fn own_address(&self, ip: Ipv4Addr) -> bool {
        ip == self.spec.vip.ip || Some(ip) == self.spec.agent_ip || self.local_ips.contains(&ip)
    }

    /// Why traffic to the VIP (or the agent address) from `src_ip` cannot be genuine: no host
    /// sends from these addresses or from port 0, nor from outside the networks clients may
    /// use, and an answer to one would go nowhere or everywhere (memcached stops answering UDP
    /// after a reply to port 0, or one it has no route for). `l4` is the IP
    /// payload; its first two bytes are the source port when `plain` says it is UDP or TCP.
    pub(super) fn bad_source_to_vip(
        &self,
        src_ip: Ipv4Addr,
        l4: &[u8],
        plain: bool,
    ) -> Option<Drop> {
        if src_ip.is_unspecified() {
            return Some(Drop::SourceUnspecified);
        }
        if src_ip.is_broadcast() || Some(src_ip) == self.vip_broadcast {
            return Some(Drop::SourceBroadcast);
        }
        if src_ip.is_multicast() {
            return Some(Drop::SourceMulticast);
        }
        if src_ip.is_loopback() {
            return Some(Drop::SourceLoopback);
        }
        if self.own_address(src_ip) {
            return Some(Drop::SourceVip);
        }
        if plain && l4.get(0..2) == Some(&[0, 0]) {
            return Some(Drop::SourcePortZero);
        }
        if !self.client_networks.iter().any(|n| n.contains(src_ip)) {
            return Some(Drop::SourceOffNet);
        }
        None
    }

    /// Whether a UDP reply of `bytes` may go to `client` now. Replies to the switch's own
    /// addresses (parts of split gets) are not limited.
    pub(super) fn reply_allowed(&mut self, client: Ipv4Addr, bytes: usize, now: Instant) -> bool {
        if self.own_address(client) {
            return true;
        }
        match &mut self.limiter {
            Some(limiter) => limiter.allow(client, bytes, now),
            None => true,
        }
    }
}

/// The ethertype and offset of what `frame` carries beneath its VLAN tags or its MPLS label
/// stack, which the source check reads as it reads an untagged frame: a host's address behind
/// a tag or a label is checked like any other (a label the switch pops, or a receiver that
/// takes the tag, would otherwise let it through in another host's name). Beneath labels only
/// IPv4, by its version, is recognised; `None` when the tags or the stack do not end within
/// the frame.
fn beneath_tags(frame: &[u8], ethertype: EtherType) -> Option<(EtherType, usize)> {
    let mut ethertype = ethertype;
    let mut at = ethernet::HEADER_LEN;
    while ethertype == EtherType::VLAN || ethertype == EtherType::QINQ {
        let inner = frame.get(at + 2..at + 4)?;
        ethertype = EtherType(u16::from_be_bytes([inner[0], inner[1]]));
        at += 4;
    }
    if ethertype == EtherType::MPLS {
        let payload = at + pipeline::label::stack_len(frame.get(at..)?)?;
        return (frame.get(payload)? >> 4 == 4).then_some((EtherType::IPV4, payload));
    }
    Some((ethertype, at))
}
