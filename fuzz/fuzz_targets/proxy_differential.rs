//! The proxy against memcached itself, unbounded: each input is a stream of bytes sent on a
//! fresh connection to one memcached directly and through the proxy (run in this process, in
//! front of two memcached servers), and the replies, masked for what two memcached processes
//! legitimately differ in, and whether the connection stayed open must match as
//! `testbed::differential::Outcome::matches` says. The first byte picks the protocol (even:
//! text, odd: binary, whose requests start with 0x80).
//!
//! Needs memcached on the PATH. Each input costs two round trips of real sockets, so this
//! target runs at hundreds of inputs a second, not millions; the seeded test
//! `proxy_differential` in the kvswitch crate runs the same check in the suite.
#![no_main]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;

use kvswitch::proxy::{Limits, Proxy, Settings};
use libfuzzer_sys::fuzz_target;
use testbed::differential::{exchange, Case};
use testbed::local::{self, Ports, Proc};

struct Fixture {
    reference: SocketAddr,
    proxy: SocketAddr,
    // Kept alive for the whole run.
    _memcached: Vec<Proc>,
    _proxy: Proxy,
}

fn memcached(ports: &Ports) -> (SocketAddr, Proc) {
    let bin = local::require("memcached").expect("memcached on the PATH");
    let ip = [127, 0, 0, 1].into();
    let addr = SocketAddr::new(ip, ports.pick(ip).expect("a free port"));
    (addr, local::memcached(&bin, addr).expect("memcached starts"))
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let ports = Ports::default();
        let (reference, r) = memcached(&ports);
        let (s1, p1) = memcached(&ports);
        let (s2, p2) = memcached(&ports);
        let ip = [127, 0, 0, 1].into();
        let listen = SocketAddr::new(ip, ports.pick(ip).expect("a free port"));
        ports.release();
        let toml = format!(
            "[pool]\nlisten = \"{listen}\"\ndistribution = \"ketama\"\nhash = \"md5\"\n\
             [[pool.servers]]\naddr = \"{s1}\"\nname = \"s1\"\n\
             [[pool.servers]]\naddr = \"{s2}\"\nname = \"s2\"\n"
        );
        let file = kvswitch::config::proxy::parse_toml(&toml, Path::new("fuzz.toml"))
            .expect("the fixture's configuration");
        let pool = file.pool_with_listen(None).expect("the fixture's pool");
        let proxy = Proxy::start(Settings {
            pools: vec![pool],
            workers: 1,
            source: None,
            limits: Limits::default(),
            caches: Vec::new(),
        })
        .expect("the proxy starts");
        Fixture {
            reference,
            proxy: listen,
            _memcached: vec![r, p1, p2],
            _proxy: proxy,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let binary = first % 2 == 1;
    let mut bytes = rest.to_vec();
    if binary && bytes.first() != Some(&0x80) {
        bytes.insert(0, 0x80);
    }
    let case = Case {
        requests: 0,
        bytes,
        binary,
    };
    let f = fixture();
    let want = exchange(f.reference, &case).expect("memcached answers");
    let got = exchange(f.proxy, &case).expect("the proxy answers");
    assert!(
        got.matches(&want),
        "memcached: {want:?}\nproxy:     {got:?}"
    );
});
