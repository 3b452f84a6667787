//! kvswitch's key-location header for clients: the format ([`wire::keyloc`], re-exported
//! here) and a UDP socket that attaches it to every datagram it sends. A datagram to one of
//! kvswitch's keyed ports (`vip.keyed_ports`) carries twelve bytes in front of the
//! application's payload: the preamble `kvl` and version 1, then where the key starts and ends
//! in the payload. The switch routes it by those key bytes and removes the header before the
//! server sees it (docs/keyloc.md).
#![forbid(unsafe_code)]

use std::io;
use std::net::{ToSocketAddrs, UdpSocket};
use std::ops::Range;

pub use wire::keyloc::*;

/// A UDP socket that sends each payload with the header for its key, to a kvswitch VIP port
/// that routes by key. Replies arrive as the server sent them, without a header.
#[derive(Debug)]
pub struct KeyedSocket {
    socket: UdpSocket,
}

impl KeyedSocket {
    /// A socket bound to `local` and connected to `vip` (the VIP's address and a port the
    /// switch routes by key-location header).
    pub fn connect(local: impl ToSocketAddrs, vip: impl ToSocketAddrs) -> io::Result<Self> {
        let socket = UdpSocket::bind(local)?;
        socket.connect(vip)?;
        Ok(KeyedSocket { socket })
    }

    /// Sends `payload`, whose key lies at `key`.
    pub fn send(&self, payload: &[u8], key: Range<usize>) -> io::Result<usize> {
        let datagram =
            attach(payload, key).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.socket.send(&datagram).map(|n| n.saturating_sub(LEN))
    }

    /// Receives one reply.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.socket.recv(buf)
    }

    /// The socket, for timeouts and the like.
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_socket_sends_the_header_and_its_payload() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let sock = KeyedSocket::connect("127.0.0.1:0", server.local_addr().unwrap()).unwrap();
        assert_eq!(sock.send(b"GET user:42", 4..11).unwrap(), 11);
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        let located = parse(&buf[..n]).unwrap();
        assert_eq!(located.key_bytes(), b"user:42");
        let refused = sock.send(b"abc", 1..1).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
    }
}
