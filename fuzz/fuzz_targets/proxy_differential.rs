//! The proxy against memcached itself, unbounded: each input is a stream of bytes sent on a
//! fresh connection to one memcached directly and through the proxy (run in this process, in
//! front of two memcached servers), and the replies, masked for what two memcached processes
//! legitimately differ in, and whether the connection stayed open must match as
//! `testbed::differential::Outcome::matches` says. The first byte picks the protocol (even:
//! text, odd: binary, whose requests start with 0x80). Inputs naming statistics or
//! process-wide settings are skipped: their replies differ between two processes by nature.
//!
//! Needs memcached on the PATH. Each input costs two exchanges over real sockets, and one
//! that leaves memcached waiting for more bytes waits for silence, so this target runs at tens
//! of inputs a second, not millions; the seeded test `proxy_differential` in the kvswitch crate
//! runs the same check in the suite.
#![no_main]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use proxy::{Limits, Proxy, Settings};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

use testbed::differential::{exchange_with, Case};
use testbed::local::{self, Ports, Proc};

struct Fixture {
    reference: SocketAddr,
    proxy: SocketAddr,
    // Kept alive for the whole run.
    _memcached: Vec<Proc>,
    _proxy: Proxy,
}

/// The memcached processes of the fixture: libFuzzer leaves by `exit` or `abort`, which run
/// no destructors, and memcached's change of user clears a parent-death signal; so they are
/// killed by PID at exit and from the panic hook.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

extern "C" fn kill_children() {
    let pids = CHILDREN.lock().map(|p| p.clone()).unwrap_or_default();
    for pid in pids {
        // SAFETY: kill takes no pointers; the PIDs are this process's own children.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

fn memcached(addr: SocketAddr) -> Proc {
    let bin = local::require("memcached").expect("memcached on the PATH");
    let mut cmd = Command::new(bin);
    cmd.args(["-p", &addr.port().to_string(), "-U", "0", "-l", "127.0.0.1"])
        .args(["-t", "1", "-m", "64", "-u", "nobody"]);
    let mut proc = Proc::spawn("memcached", &mut cmd).expect("memcached starts");
    if let Ok(mut pids) = CHILDREN.lock() {
        pids.push(proc.pid());
    }
    proc.wait_listening(addr, None).expect("memcached listens");
    proc
}

/// Requests whose replies differ between two memcached processes by nature (statistics,
/// settings that belong to one process) or that change the server for every later input.
fn out_of_scope(bytes: &[u8]) -> bool {
    const WORDS: [&[u8]; 9] = [
        b"stats",
        b"lru",
        b"watch",
        b"slabs",
        b"cache_memlimit",
        b"misbehave",
        b"debugtime",
        b"extstore",
        b"verbosity",
    ];
    WORDS.iter().any(|w| bytes.windows(w.len()).any(|x| x == *w))
        // A binary STAT anywhere.
        || bytes.windows(2).any(|w| w == [0x80, 0x10])
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let ports = Ports::default();
        let ip = [127, 0, 0, 1].into();
        let pick = || SocketAddr::new(ip, ports.pick(ip).expect("a free port"));
        let (reference, s1, s2, listen) = (pick(), pick(), pick(), pick());
        ports.release();
        // SAFETY: registers a function that only reads a mutex and sends signals.
        unsafe {
            libc::atexit(kill_children);
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            kill_children();
            previous(info);
        }));
        let (r, p1, p2) = (memcached(reference), memcached(s1), memcached(s2));
        let toml = format!(
            "[pool]\ndistribution = \"ketama\"\nhash = \"md5\"\n\
             [[pool.servers]]\naddr = \"{s1}\"\nname = \"s1\"\n\
             [[pool.servers]]\naddr = \"{s2}\"\nname = \"s2\"\n"
        );
        let file = config::proxy::parse_toml(&toml, Path::new("fuzz.toml"))
            .expect("the fixture's configuration");
        let pool = file.pool_with_listen(Some(listen)).expect("the fixture's pool");
        let proxy = Proxy::start(Settings {
            pools: vec![std::sync::Arc::new(
                proxy::Pool::new(pool).expect("the fixture's ring"),
            )],
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
    if out_of_scope(rest) {
        return;
    }
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
    // Most inputs leave memcached waiting for more bytes: wait briefly, resend the end
    // marker once.
    let quiet = Duration::from_millis(60);
    let want = exchange_with(f.reference, &case, quiet, 1).expect("memcached answers");
    let got = exchange_with(f.proxy, &case, quiet, 1).expect("the proxy answers");
    assert!(
        got.matches(&want),
        "memcached: {want:?}\nproxy:     {got:?}"
    );
});
