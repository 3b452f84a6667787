//! What leaves this switch: fabric messages toward another switch or a home node of its rack,
//! and memcached datagrams to clients and servers in the other end's own addresses.

use super::*;

/// A UDP frame from `src` to `dst` carrying `payload`; `None` when it would not fit.
fn udp_frame(
    src_mac: Mac,
    dst_mac: Mac,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    payload: &[u8],
) -> Option<Vec<u8>> {
    let ends = UdpEnds {
        src_mac,
        dst_mac,
        src_ip: src.0,
        dst_ip: dst.0,
        src_port: src.1,
        dst_port: dst.1,
    };
    let frame = crate::frame::udp_frame(&ends, &[payload]);
    (!frame.is_empty()).then_some(frame)
}

impl FabricSwitch {
    /// Sends a fabric message to switch `to`. False when no way leads there.
    pub(super) fn send(
        &mut self,
        to: SwitchId,
        header: &Header,
        payload: &[u8],
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> bool {
        let Some(member) = self.spec.member(to).copied() else {
            self.stats.no_route += 1;
            return false;
        };
        let Some((port, designated)) = self.toward(to, header.key_hash, now) else {
            self.stats.no_route += 1;
            return false;
        };
        if !designated {
            self.stats.detours += 1;
        }
        let Some(frame) = self.message_frame((member.mac, member.ip), header, payload) else {
            self.stats.malformed += 1;
            return false;
        };
        self.stats.messages_sent += 1;
        emit.push(Emit {
            dest: Dest::Port(port),
            frame,
        });
        true
    }

    /// Sends `datagram` to a client from a server's address, as the server sent it.
    pub(super) fn send_to_client(
        &mut self,
        client: (Ipv4Addr, u16),
        server: (Ipv4Addr, u16),
        datagram: &[u8],
        emit: &mut Vec<Emit>,
    ) {
        let Some(&(mac, port)) = self.hosts.get(&client.0) else {
            self.stats.no_route += 1;
            return;
        };
        if let Some(frame) = udp_frame(self.me.mac, mac, server, client, datagram) {
            self.stats.replies_out += 1;
            emit.push(Emit {
                dest: Dest::Port(port),
                frame,
            });
        }
    }

    /// Sends a client's datagram to its server, from the client's address, so that the server
    /// answers the client (and its reply passes this home on the way).
    pub(super) fn send_to_server(
        &mut self,
        client: (Ipv4Addr, u16),
        server: (Ipv4Addr, u16),
        datagram: &[u8],
        emit: &mut Vec<Emit>,
    ) {
        let Some(s) = self.server(server.0, server.1).copied() else {
            self.stats.unexpected += 1;
            return;
        };
        let Some(frame) = udp_frame(self.me.mac, s.mac, client, server, datagram) else {
            self.stats.malformed += 1;
            return;
        };
        self.stats.to_server += 1;
        self.to_host(s.mac, frame, emit);
    }

    /// Sends `frame` to the host with `mac`; one not heard from yet is looked for out of
    /// every host port.
    pub(super) fn to_host(&self, mac: Mac, frame: Vec<u8>, emit: &mut Vec<Emit>) {
        let ports = match self.macs.get(&mac) {
            Some(&port) => vec![port],
            None => self.host_ports(),
        };
        for p in ports {
            emit.push(Emit {
                dest: Dest::Port(p),
                frame: frame.clone(),
            });
        }
    }

    /// Sends a fabric message to a home node of this rack.
    pub(super) fn send_to_node(
        &mut self,
        node: &FabricServer,
        header: &Header,
        payload: &[u8],
        emit: &mut Vec<Emit>,
    ) {
        let Some(frame) = self.message_frame((node.mac, node.ip), header, payload) else {
            self.stats.malformed += 1;
            return;
        };
        self.stats.to_home_node += 1;
        self.to_host(node.mac, frame, emit);
    }

    /// A fabric message in a frame from this switch to the switch or home node at `(mac, ip)`.
    pub(super) fn message_frame(
        &self,
        (mac, ip): (Mac, Ipv4Addr),
        header: &Header,
        payload: &[u8],
    ) -> Option<Vec<u8>> {
        let mut message = Vec::with_capacity(inc::HEADER_LEN + payload.len());
        header.emit(&mut message);
        message.extend_from_slice(payload);
        udp_frame(
            self.me.mac,
            mac,
            (self.me.ip, inc::PORT),
            (ip, inc::PORT),
            &message,
        )
    }
}
