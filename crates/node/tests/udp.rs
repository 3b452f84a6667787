//! UDP through memcached's 8-byte frame header: request ids echoed, long replies split into
//! numbered datagrams that join to what memcached sends.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use common::{node, Memcached};

fn client() -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a client socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("read timeout");
    socket
}

fn frame(request_id: u16, total: u16, payload: &[u8]) -> Vec<u8> {
    let mut datagram = request_id.to_be_bytes().to_vec();
    datagram.extend_from_slice(&[0, 0]);
    datagram.extend_from_slice(&total.to_be_bytes());
    datagram.extend_from_slice(&[0, 0]);
    datagram.extend_from_slice(payload);
    datagram
}

/// Sends one request and joins the datagrams of its reply; also returns how many there were.
fn request(socket: &UdpSocket, to: SocketAddr, request_id: u16, payload: &[u8]) -> (Vec<u8>, u16) {
    socket
        .send_to(&frame(request_id, 1, payload), to)
        .expect("send");
    let mut pieces = BTreeMap::new();
    let mut buf = [0u8; 2048];
    loop {
        let (n, _) = socket.recv_from(&mut buf).expect("a reply datagram");
        assert!(n >= 8 && n - 8 <= 1400, "datagram of {n} bytes");
        let id = u16::from_be_bytes([buf[0], buf[1]]);
        let seq = u16::from_be_bytes([buf[2], buf[3]]);
        let total = u16::from_be_bytes([buf[4], buf[5]]);
        assert_eq!(&buf[6..8], &[0, 0], "reserved field");
        if id != request_id {
            continue;
        }
        pieces.insert(seq, buf[8..n].to_vec());
        if pieces.len() == usize::from(total) {
            assert_eq!(
                pieces.keys().copied().collect::<Vec<_>>(),
                (0..total).collect::<Vec<_>>()
            );
            return (pieces.into_values().flatten().collect(), total);
        }
    }
}

#[test]
fn get_and_set_through_the_frame_header() {
    let node = node(|_| {});
    let addr = node.udp_addr().unwrap();
    let socket = client();
    assert_eq!(
        request(&socket, addr, 0x1234, b"set u 3 0 5\r\nhello\r\n"),
        (b"STORED\r\n".to_vec(), 1)
    );
    assert_eq!(
        request(&socket, addr, 0xbeef, b"get u\r\n"),
        (b"VALUE u 3 5\r\nhello\r\nEND\r\n".to_vec(), 1)
    );
    // A multi-key get is answered as one message.
    assert_eq!(
        request(&socket, addr, 7, b"get u nope u\r\n"),
        (
            b"VALUE u 3 5\r\nhello\r\nVALUE u 3 5\r\nhello\r\nEND\r\n".to_vec(),
            1
        )
    );
    // A request claiming several datagrams is dropped, as memcached does.
    socket.send_to(&frame(9, 2, b"get u\r\n"), addr).unwrap();
    assert_eq!(
        request(&socket, addr, 10, b"mn\r\n"),
        (b"MN\r\n".to_vec(), 1)
    );
}

#[test]
fn long_replies_match_memcached() {
    let Some(memcached) = Memcached::start() else {
        eprintln!("memcached not installed; skipping");
        return;
    };
    let node = node(|_| {});
    let value: Vec<u8> = (0..5000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut set = b"set long 0 0 5000\r\n".to_vec();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\n");
    let socket = client();
    for addr in [memcached.addr, node.udp_addr().unwrap()] {
        assert_eq!(request(&socket, addr, 1, &set).0, b"STORED\r\n");
    }
    let want = request(&socket, memcached.addr, 2, b"get long\r\n");
    let got = request(&socket, node.udp_addr().unwrap(), 2, b"get long\r\n");
    assert_eq!(got, want);
    assert_eq!(got.1, 4);
}
