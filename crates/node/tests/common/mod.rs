//! Shared test helpers: a reference memcached on loopback and a node started in-process.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::Duration;

use node::{Node, NodeArgs};
use testbed::local::{self, Proc};

/// A port free for TCP and UDP on loopback at the time of the call.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local address").port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A memcached 1.6 process on loopback, killed (by its own PID) when dropped.
pub struct Memcached {
    _proc: Proc,
    pub addr: SocketAddr,
}

impl Memcached {
    /// Starts memcached with TCP and UDP on one free port; `None` if it is not installed.
    pub fn start() -> Option<Memcached> {
        let bin = local::require("memcached").ok()?;
        // Another process may take the port between the pick and memcached's bind: then
        // memcached exits, and it is started again on another port.
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new(&bin);
            cmd.args(["-U", &port.to_string(), "-p", &port.to_string()])
                .args(["-l", "127.0.0.1", "-u", "root", "-t", "1"]);
            let mut proc = Proc::spawn("memcached", &mut cmd).ok()?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            // memcached binds TCP before UDP: wait for a UDP answer too.
            let udp = || {
                testbed::wait_for(
                    Duration::from_secs(5),
                    || None,
                    || testbed::memcached_udp_version(addr),
                )
            };
            if proc.wait_listening(addr, None).is_ok() && udp().is_ok() {
                return Some(Memcached { _proc: proc, addr });
            }
        }
        panic!("memcached did not start on any of five ports");
    }
}

/// A node on an ephemeral loopback port, with the given changes to the defaults.
pub fn node(configure: impl FnOnce(&mut NodeArgs)) -> Node {
    let mut args = NodeArgs {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        threads: 2,
        ..NodeArgs::default()
    };
    configure(&mut args);
    Node::start(&args).expect("start the node")
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

/// Sends `request` and reads until the reply so far satisfies `done`.
pub fn exchange(stream: &mut TcpStream, request: &[u8], done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    stream.write_all(request).expect("send");
    let mut reply = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !done(&reply) {
        let n = stream.read(&mut chunk).expect("read a reply");
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&chunk[..n]);
    }
    reply
}
