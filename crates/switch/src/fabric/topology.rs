//! The fabric as this switch sees it: what each port is, which neighbours are up behind its
//! links, where racks, servers and home nodes are, and the port toward another switch.

use super::*;

impl FabricSwitch {
    pub(super) fn port_role(&self, port: u16) -> Option<PortRole> {
        self.spec.ports.get(usize::from(port)).copied()
    }

    pub(super) fn is_host_port(&self, port: u16) -> bool {
        self.port_role(port) == Some(PortRole::Host)
    }

    /// Whether the neighbour behind link `port` is up: heard within `dead_after`, or not yet
    /// due to be (a switch starts with every neighbour up).
    pub(super) fn up(&self, port: u16, now: Instant) -> bool {
        match self.heard.get(usize::from(port)).copied().flatten() {
            Some(at) => now < at + self.spec.dead_after,
            None => false,
        }
    }

    /// The port a link to `to` leaves by, if it is up.
    pub(super) fn link_to(&self, to: SwitchId, now: Instant) -> Option<u16> {
        (0..self.spec.ports.len() as u16)
            .find(|&p| self.port_role(p) == Some(PortRole::Link(to)) && self.up(p, now))
    }

    /// Root links that are up, in port order, with their roots.
    pub(super) fn roots_up(&self, now: Instant) -> Vec<(SwitchId, u16)> {
        (0..self.spec.ports.len() as u16)
            .filter_map(|p| match self.port_role(p) {
                Some(PortRole::Link(to))
                    if self.spec.member(to).map(|m| m.role) == Some(Role::Root)
                        && self.up(p, now) =>
                {
                    Some((to, p))
                }
                _ => None,
            })
            .collect()
    }

    pub(super) fn rack_of(&self, ip: Ipv4Addr) -> Option<&Rack> {
        self.spec.racks.iter().find(|r| r.contains(ip))
    }

    pub(super) fn server(&self, ip: Ipv4Addr, port: u16) -> Option<&FabricServer> {
        self.spec
            .servers
            .iter()
            .find(|s| s.ip == ip && s.port == port)
    }

    pub(super) fn home_of(&self, server: Ipv4Addr) -> Option<SwitchId> {
        self.rack_of(server).map(|r| r.tor)
    }

    pub(super) fn member_by_ip(&self, ip: Ipv4Addr) -> Option<Member> {
        self.spec.members.iter().find(|m| m.ip == ip).copied()
    }

    /// The port toward switch `to` for a message about `key_hash`: the link to it if up;
    /// from a ToR to another ToR, the key's designated root if up, else another root.
    /// Whether it left by the designated root is the second value.
    pub(super) fn toward(&self, to: SwitchId, key_hash: u32, now: Instant) -> Option<(u16, bool)> {
        if let Some(p) = self.link_to(to, now) {
            return Some((p, true));
        }
        if self.me.role != Role::Tor {
            return None;
        }
        let designated = self.spec.registration.root(key_hash);
        if let Some(p) = self.link_to(designated, now) {
            return Some((p, true));
        }
        let roots = self.roots_up(now);
        if roots.is_empty() {
            return None;
        }
        Some((roots[key_hash as usize % roots.len()].1, false))
    }

    /// The home node of this rack at `ip` (a server marked `home_node` under this ToR).
    pub(super) fn home_node(&self, ip: Ipv4Addr) -> Option<FabricServer> {
        self.spec
            .servers
            .iter()
            .find(|s| s.ip == ip && s.home_node)
            .filter(|s| self.home_of(s.ip) == Some(self.me.id))
            .copied()
    }

    pub(super) fn host_ports(&self) -> Vec<u16> {
        (0..self.spec.ports.len() as u16)
            .filter(|&p| self.is_host_port(p))
            .collect()
    }
}
