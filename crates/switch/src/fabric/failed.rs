//! Switches a registration table names failed: once a lease has passed their copies are taken
//! as gone, the writes that waited for them go on, and the home nodes of the rack are told.

use super::*;

impl FabricSwitch {
    /// Writes that waited only for switches whose failure is a lease old go on.
    pub(super) fn release_failed(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        let due: Vec<SwitchId> = self
            .failing
            .iter()
            .filter(|&&(_, at)| now >= at)
            .map(|&(id, _)| id)
            .collect();
        self.failing.retain(|&(_, at)| now < at);
        for id in due {
            if !self.spec.registration.is_failed(id) {
                continue;
            }
            for (_, write) in self.directory.switch_failed(id, now) {
                self.forward_write(write, now, emit);
            }
            self.relay_failed(id, now, emit);
            self.tell_nodes_failed(id, emit);
        }
        // Told again every second while the table names them failed: a notice may be lost.
        if self.next_failed_notice.is_none_or(|at| now >= at) {
            self.next_failed_notice = Some(now + FAILED_NOTICE_EVERY);
            let released: Vec<SwitchId> = self
                .spec
                .members
                .iter()
                .map(|m| m.id)
                .filter(|&id| {
                    self.spec.registration.is_failed(id)
                        && !self.failing.iter().any(|&(f, _)| f == id)
                })
                .collect();
            for id in released {
                self.tell_nodes_failed(id, emit);
            }
        }
    }

    /// Tells every home node of this rack that switch `id` is counted out.
    pub(super) fn tell_nodes_failed(&mut self, id: SwitchId, emit: &mut Vec<Emit>) {
        let nodes: Vec<FabricServer> = self
            .spec
            .servers
            .iter()
            .filter(|s| self.home_node(s.ip).is_some())
            .copied()
            .collect();
        for node in nodes {
            let failed = Header {
                request_id: 0,
                command: Command::InvalidateAck,
                key_hash: 0,
                flags: flags::VIA | flags::FAILED,
                origin: self.me.id,
                via: id,
                epoch: 0,
                client: (Ipv4Addr::UNSPECIFIED, 0),
                server: (node.ip, node.port),
                lease_ms: 0,
            };
            self.send_to_node(&node, &failed, &[], emit);
        }
    }
}
