//! The capacity limit: a closed-loop TCP load above capacity is served at the capacity, and UDP
//! requests beyond it are dropped and counted.

mod common;

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{connect, exchange, node};

const CAPACITY: u64 = 5000;

#[test]
fn tcp_rate_holds_at_capacity() {
    let node = node(|args| args.capacity = CAPACITY);
    let addr = node.tcp_addr().unwrap();
    let run = Duration::from_secs(2);
    // Measured over the middle second, away from the initial burst and the ramp-down.
    let (from, to) = (Duration::from_millis(500), Duration::from_millis(1500));
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut stream = connect(addr);
                let mut in_window = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let reply = exchange(&mut stream, b"get k\r\n", |r| r.ends_with(b"END\r\n"));
                    assert_eq!(reply, b"END\r\n");
                    let at = start.elapsed();
                    if at >= from && at < to {
                        in_window += 1;
                    }
                }
                in_window
            })
        })
        .collect();
    thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let served: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let rate = served as f64 / (to - from).as_secs_f64();
    eprintln!("closed-loop rate {rate:.0} rps at capacity {CAPACITY}");
    let capacity = CAPACITY as f64;
    assert!(
        rate >= 0.95 * capacity && rate <= 1.05 * capacity,
        "rate {rate:.0} rps outside 0.95..1.05 x {CAPACITY}"
    );
    let delays = node
        .store()
        .counters
        .capacity_delays
        .load(Ordering::Relaxed);
    assert!(delays > 0, "no request was held back");
}

#[test]
fn udp_over_capacity_drops_and_counts() {
    let node = node(|args| {
        args.capacity = 1000;
        args.burst = Some(10);
    });
    let addr = node.udp_addr().unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let sent = 2000u64;
    let start = Instant::now();
    for id in 0..sent {
        let mut datagram = (id as u16).to_be_bytes().to_vec();
        datagram.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
        datagram.extend_from_slice(b"get k\r\n");
        socket.send_to(&datagram, addr).unwrap();
        if id % 100 == 99 {
            // Keep the socket buffers from overflowing, so that losses are the node's.
            thread::sleep(Duration::from_millis(2));
        }
    }
    let elapsed = start.elapsed();
    let mut replies = 0u64;
    let mut buf = [0u8; 2048];
    while let Ok((n, _)) = socket.recv_from(&mut buf) {
        assert_eq!(&buf[8..n], b"END\r\n");
        replies += 1;
    }
    let drops = node.store().counters.capacity_drops.load(Ordering::Relaxed);
    eprintln!("udp: sent {sent} in {elapsed:?}, answered {replies}, dropped {drops}");
    // Every request is answered or counted; a few may be lost in a socket buffer on a busy
    // machine, but never more answered than sent.
    assert!(replies + drops <= sent);
    assert!(
        replies + drops >= sent - sent / 50,
        "{} lost",
        sent - replies - drops
    );
    // At most the burst plus what the bucket refilled while sending (and a margin for the
    // time the last datagrams spent in the socket buffer).
    let allowed = 10.0 + 1000.0 * (elapsed.as_secs_f64() + 0.05);
    assert!(
        (replies as f64) <= allowed,
        "{replies} answered, at most {allowed:.0} allowed"
    );
    assert!(drops > sent / 2, "only {drops} dropped");
}
