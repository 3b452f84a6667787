//! Requests that once hung a connection or let it grow without bound.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::{connect, exchange, node};
use node::MAX_CONNECTIONS;

/// Reads until `done` holds or the connection closes; `None` after two seconds of silence.
fn read_reply(stream: &mut TcpStream, done: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while !done(&reply) {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None
            }
            Err(_) => break,
        }
    }
    Some(reply)
}

#[test]
fn a_meta_key_holding_a_carriage_return_does_not_hang() {
    let node = node(|_| {});
    let mut stream = connect(node.tcp_addr().unwrap());
    // Run in a thread so that a regression fails the test instead of hanging it.
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        stream
            .write_all(b"ms a\r18446744073709551585 2\r\nhiX\r\nversion\r\n")
            .unwrap();
        let reply = read_reply(&mut stream, |r| {
            r.ends_with(b"\r\n") && r.windows(8).any(|w| w == b"VERSION ")
        });
        let _ = tx.send(reply);
    });
    let reply = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the node answered in time")
        .expect("the node answered within two seconds");
    // The block the parser read (`hiX\r`) is skipped; the lone `\n` left is an empty line.
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.starts_with("CLIENT_ERROR bad data chunk\r\nERROR\r\nVERSION "),
        "unexpected reply {text:?}"
    );
}

#[test]
fn connections_past_the_cap_are_closed() {
    let node = node(|_| {});
    let addr = node.tcp_addr().unwrap();
    let counters = &node.store().counters;
    let open = counters.curr_connections.load(Ordering::Relaxed);
    counters
        .curr_connections
        .store(MAX_CONNECTIONS, Ordering::Relaxed);
    let mut refused = connect(addr);
    let _ = refused.write_all(b"version\r\n");
    let reply = read_reply(&mut refused, |r| r.ends_with(b"\r\n")).expect("closed in time");
    assert!(reply.is_empty(), "answered {reply:?}");
    counters.curr_connections.store(open, Ordering::Relaxed);
    let mut served = connect(addr);
    let reply = exchange(&mut served, b"version\r\n", |r| r.ends_with(b"\r\n"));
    assert!(reply.starts_with(b"VERSION "));
}

#[test]
fn a_long_multi_get_arriving_in_pieces_is_served() {
    let node = node(|_| {});
    let mut stream = connect(node.tcp_addr().unwrap());
    let reply = exchange(&mut stream, b"set k 0 0 1\r\nv\r\n", |r| {
        r.ends_with(b"\r\n")
    });
    assert_eq!(reply, b"STORED\r\n");
    let keys = 20_000;
    let mut line = b"get".to_vec();
    for _ in 0..keys {
        line.extend_from_slice(b" k");
    }
    line.extend_from_slice(b"\r\n");
    for piece in line.chunks(7000) {
        stream.write_all(piece).unwrap();
        thread::sleep(Duration::from_millis(2));
    }
    let reply = read_reply(&mut stream, |r| r.ends_with(b"END\r\n")).expect("a reply");
    let expected = [b"VALUE k 0 1\r\nv\r\n".repeat(keys), b"END\r\n".to_vec()].concat();
    assert_eq!(reply.len(), expected.len());
    assert!(reply == expected);
}

#[test]
fn append_past_the_item_limit_is_not_stored() {
    let node = node(|_| {});
    let mut stream = connect(node.tcp_addr().unwrap());
    let mut request = b"set k 0 0 1000000\r\n".to_vec();
    request.extend_from_slice(&[b'a'; 1_000_000]);
    request.extend_from_slice(b"\r\nappend k 0 0 100000\r\n");
    request.extend_from_slice(&[b'b'; 100_000]);
    request.extend_from_slice(b"\r\nms k 100000 MA\r\n");
    request.extend_from_slice(&[b'b'; 100_000]);
    request.extend_from_slice(b"\r\n");
    let reply = exchange(&mut stream, &request, |r| r.ends_with(b"NS\r\n"));
    // As memcached 1.6 answers.
    assert_eq!(reply, b"STORED\r\nNOT_STORED\r\nNS\r\n");
}
