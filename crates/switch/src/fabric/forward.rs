//! Ordinary frames, which the fabric carries unchanged: within a rack by learned MAC, between
//! racks up to a root and down to the destination's ToR.

use super::*;

impl FabricSwitch {
    /// Hosts' frames within the rack: by learned MAC, else out of every other host port.
    pub(super) fn switch_l2(
        &mut self,
        in_port: u16,
        dst: Mac,
        frame: &[u8],
        emit: &mut Vec<Emit>,
    ) -> Fate {
        if let Some(&p) = self.macs.get(&dst) {
            if p == in_port {
                return Fate::Consumed;
            }
            self.stats.routed += 1;
            return Fate::Out(p);
        }
        for p in self.host_ports() {
            if p != in_port {
                emit.push(Emit {
                    dest: Dest::Port(p),
                    frame: frame.to_vec(),
                });
            }
        }
        Fate::Consumed
    }

    /// Ordinary IPv4: within the rack by MAC, to another rack by a root (the flow's hash picks
    /// among those up), from a root down to the rack's ToR; to a switch's address, toward it.
    pub(super) fn route(
        &mut self,
        in_port: u16,
        frame: &mut [u8],
        flow: Option<u32>,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate {
        let Some(dst_ip) = frame
            .get(ethernet::HEADER_LEN..)
            .and_then(|l3| ipv4::Packet::new_checked(l3).ok())
            .map(|ip| ip.dst())
        else {
            self.stats.malformed += 1;
            return Fate::Consumed;
        };
        let flow = flow.unwrap_or_else(|| fnv1a_parts(&[&frame[26..34]]));
        if let Some(member) = self.member_by_ip(dst_ip) {
            if member.id == self.me.id {
                self.stats.unexpected += 1;
                return Fate::Consumed;
            }
            return match self.toward(member.id, flow, now) {
                Some((p, _)) if p != in_port => {
                    self.stats.routed += 1;
                    Fate::Out(p)
                }
                _ => {
                    self.stats.no_route += 1;
                    Fate::Consumed
                }
            };
        }
        let Some(rack) = self.rack_of(dst_ip).copied() else {
            self.stats.no_route += 1;
            return Fate::Consumed;
        };
        match self.me.role {
            Role::Tor if rack.tor == self.me.id => {
                let dst = ethernet::Frame::new_checked(&frame[..])
                    .map(|e| e.dst())
                    .unwrap_or(Mac::BROADCAST);
                self.switch_l2(in_port, dst, frame, emit)
            }
            Role::Tor => {
                if !self.is_host_port(in_port) {
                    // A ToR never carries traffic between two other switches.
                    self.stats.no_route += 1;
                    return Fate::Consumed;
                }
                let roots = self.roots_up(now);
                if roots.is_empty() {
                    self.stats.no_route += 1;
                    return Fate::Consumed;
                }
                self.stats.routed += 1;
                Fate::Out(roots[flow as usize % roots.len()].1)
            }
            Role::Root => match self.link_to(rack.tor, now) {
                Some(p) if p != in_port => {
                    self.stats.routed += 1;
                    Fate::Out(p)
                }
                _ => {
                    self.stats.no_route += 1;
                    Fate::Consumed
                }
            },
        }
    }
}
