//! A ToR's host ports: which MAC and address each host may send from, which frames may enter
//! at all, and the ARP answer for the switch's own address.

use super::*;

/// Why a host's frame is refused at its ToR.
pub(super) enum Refusal {
    /// Its source or destination (`refused_sources`).
    Source,
    /// A fragment to a server (`refused_fragments`).
    Fragment,
}

impl FabricSwitch {
    /// Binds `mac` to `port`, the host port a frame from it came in on, if it is not bound
    /// elsewhere; `false` when it is: a host's MAC stays on the port it was first heard on,
    /// so another host using it could neither draw its traffic nor speak for it (a server's
    /// replies fill the caches). A server's MAC is always bound; other hosts' while the table
    /// has room (past it their frames are still switched, flooded within the rack).
    pub(super) fn bind_mac(&mut self, mac: Mac, port: u16) -> bool {
        if !mac.is_unicast() {
            return true;
        }
        match self.macs.get(&mac) {
            Some(&p) => p == port,
            None => {
                let server = self.spec.servers.iter().any(|s| s.mac == mac);
                if server || self.macs.len() < MAX_HOSTS {
                    self.macs.insert(mac, port);
                }
                true
            }
        }
    }

    /// Binds the IPv4 source of `frame` (already checked to be in this rack) to the MAC and
    /// port it came from, if it is not bound to others; `false` when it is, or when it is a
    /// server's address sent from another MAC than the server's: a host's address is its own
    /// (the fabric sends replies to it by this binding).
    pub(super) fn bind_ip(&mut self, frame: &[u8], mac: Mac, port: u16) -> bool {
        let Some(ip) = frame
            .get(ethernet::HEADER_LEN..)
            .and_then(|l3| ipv4::Packet::new_checked(l3).ok())
            .map(|p| p.src())
        else {
            return true;
        };
        if self.spec.servers.iter().any(|s| s.ip == ip && s.mac != mac) {
            return false;
        }
        match self.hosts.get(&ip) {
            Some(&bound) => bound == (mac, port),
            None => {
                if self.hosts.len() < MAX_HOSTS {
                    self.hosts.insert(ip, (mac, port));
                }
                true
            }
        }
    }

    /// The answer to a host's ARP request for this switch's own address (a home node sends
    /// its ToR messages).
    pub(super) fn arp_for_me(&self, frame: &[u8]) -> Option<Vec<u8>> {
        let packet = wire::arp::Packet::new_checked(frame.get(ethernet::HEADER_LEN..)?).ok()?;
        let asked = wire::arp::Repr::parse(&packet).ok()?;
        if asked.operation != wire::arp::Operation::Request || asked.target_ip != self.me.ip {
            return None;
        }
        let reply = wire::arp::Repr {
            operation: wire::arp::Operation::Reply,
            sender_mac: self.me.mac,
            sender_ip: self.me.ip,
            target_mac: asked.sender_mac,
            target_ip: asked.sender_ip,
        };
        Some(crate::frame::arp_frame(asked.sender_mac, &reply))
    }

    /// Why an IPv4 frame from a host port may not enter, if it may not: its source must be in
    /// this ToR's rack and not a switch's address, its destination not a switch's address
    /// (but this switch's own for a home node of the rack); and a fragment to a server of the
    /// fabric is refused, as the fabric reads every datagram to its servers whole (a
    /// fragmented one could carry a write past the home).
    pub(super) fn host_refusal(&self, frame: &[u8]) -> Option<Refusal> {
        let Some(ip) = frame
            .get(ethernet::HEADER_LEN..)
            .and_then(|l3| ipv4::Packet::new_checked(l3).ok())
        else {
            return Some(Refusal::Source);
        };
        let (src, dst) = (ip.src(), ip.dst());
        let source_ok = self.me.role == Role::Tor
            && self.rack_of(src).map(|r| r.tor) == Some(self.me.id)
            && self.member_by_ip(src).is_none()
            && (self.member_by_ip(dst).is_none()
                || (dst == self.me.ip && self.home_node(src).is_some()));
        if !source_ok {
            Some(Refusal::Source)
        } else if ip.is_fragment() && self.spec.servers.iter().any(|s| s.ip == dst) {
            Some(Refusal::Fragment)
        } else {
            None
        }
    }
}
