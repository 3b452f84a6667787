//! The control plane's figures, through the real HTTP API against a switch forwarding on
//! in-memory ports (all in this process):
//!
//! - entries installed per second, one `POST` per entry and in batches of 10,000
//!   (`POST /api/v1/batch`), each into a fresh exact table;
//! - the forwarding rate while a client installs and deletes batches of entries at 12,000
//!   changes/s, at 50,000 changes/s and as fast as the API takes them, as a fraction of the
//!   idle rate, measured side by side in alternating windows and reported as medians.
//!
//! The frame generator and the forwarding thread are pinned to CPUs 0 and 1. The machine's
//! cores are shared by the frame generator, the forwarding thread, the API
//! thread and the API's client, so the storm's cost includes theirs. The API thread runs
//! below the forwarding thread (as in the daemon), and so does the storm's client, which
//! stands for a controller on another machine. Nothing here asserts on
//! time: `cargo bench -p kvswitch --bench control`.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::api::Client;
use daemon::api::{serve, Api, Exporter};
use dataplane::{Driver, RunOptions};
use kv::{Distribution, HashFn};
use kvio::{mem_pair, Batch, MemPort, Port};
use serde_json::{json, Value};
use switch::control::Change;
use switch::frame::{udp_frame, UdpEnds};
use switch::pool::Pool;
use switch::stats::Stats;
use switch::{spec, Switch, SwitchSpec};
use wire::ethernet::Mac;

const SINGLE: usize = 2_000;
const BATCH: usize = 10_000;
const BATCHES: usize = 5;
const WINDOW: Duration = Duration::from_millis(500);
const WINDOWS: usize = 10;

struct Quiet;

impl Exporter for Quiet {
    fn metrics(&self, _: &mut api::metrics::Exposition) {}

    fn status(&self) -> Value {
        json!({})
    }
}

/// The forwarding thread's own cost of a change: `Switch::apply` on a switch of its own, in
/// batches of 1,000 adds and 1,000 deletes as the storm sends them (no HTTP, no JSON).
fn apply_cost() -> f64 {
    let servers = vec![spec::Server {
        addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), 11211),
        mac: Some(Mac([2, 0, 0, 0, 1, 1])),
    }];
    let spec = SwitchSpec::new(2, Ipv4Addr::new(10, 0, 0, 100), servers);
    let pool = Arc::new(Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap());
    let mut sw = Switch::new(spec, pool, Arc::new(Stats::new(2, 1))).unwrap();
    let def = json!({"name": "storm", "kind": "exact", "key": ["ip_dst"], "size": 1_000_000});
    sw.create_table(serde_json::from_value(def).unwrap())
        .unwrap();
    let mut ids: Vec<u64> = Vec::new();
    let mut per_change = Vec::new();
    for round in 0..50u32 {
        let mut changes: Vec<Change> = ids
            .drain(..)
            .map(|id| Change::Delete {
                table: "storm".into(),
                id,
            })
            .collect();
        changes.extend((0..1000u32).map(|i| {
            let ip = Ipv4Addr::from(0x0b00_0000 + round * 1000 + i);
            let entry = json!({"match": {"ip_dst": ip.to_string()}, "actions": ["drop"]});
            Change::Add {
                table: "storm".into(),
                entry: serde_json::from_value(entry).unwrap(),
            }
        }));
        let n = changes.len();
        let started = Instant::now();
        ids = sw.apply(changes).unwrap();
        per_change.push(started.elapsed().as_nanos() as f64 / n as f64);
        let keep = ids.len().saturating_sub(1000);
        ids.drain(..keep);
    }
    median(&mut per_change)
}

fn main() {
    let servers = vec![spec::Server {
        addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), 11211),
        mac: Some(Mac([2, 0, 0, 0, 1, 1])),
    }];
    let spec = SwitchSpec::new(2, Ipv4Addr::new(10, 0, 0, 100), servers);
    let pool = Arc::new(Pool::new(spec.pool_spec(Distribution::Ketama, HashFn::Md5)).unwrap());
    let stats = Arc::new(Stats::new(2, 1));
    let sw = Switch::new(spec, pool, stats.clone()).unwrap();
    let (a0, mut h0) = mem_pair().unwrap();
    let (a1, mut h1) = mem_pair().unwrap();
    let (a0, a1) = (a0.with_queue_limit(4096), a1.with_queue_limit(1 << 20));
    let ports: Vec<Box<dyn Port>> = vec![Box::new(a0), Box::new(a1)];
    let (remote, inbox) = dataplane::remote::<Switch>().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let mut driver = Driver::new(ports, sw, None, stats.clone());
    let forwarder = std::thread::spawn(move || {
        pin_to(1);
        driver
            .run(
                &RunOptions::default(),
                Some(&inbox),
                &|| stopped.load(Ordering::Relaxed),
                &mut |_| {},
            )
            .unwrap();
    });
    let addr = serve(
        TcpListener::bind("127.0.0.1:0").unwrap(),
        Api {
            exporter: Arc::new(Quiet),
            switch: Some(remote),
            token: None,
            pools: Vec::new(),
            reload: None,
            egress: None,
            serving: Default::default(),
        },
    )
    .unwrap();
    let client = Client::new(addr, None);

    // Installs.
    let table = |name: &str| {
        client
            .call(
                "POST",
                "/api/v1/tables",
                Some(
                    &json!({"name": name, "kind": "exact", "key": ["ip_dst", "l4_dst"],
                             "size": 1_000_000}),
                ),
            )
            .unwrap();
    };
    let entry = |i: usize| {
        json!({"match": {"ip_dst": Ipv4Addr::from(0x0a00_0000 + i as u32).to_string(),
                         "l4_dst": 11211}, "actions": [{"output": 1}]})
    };
    table("single");
    let started = Instant::now();
    for i in 0..SINGLE {
        client
            .call("POST", "/api/v1/tables/single/entries", Some(&entry(i)))
            .unwrap();
    }
    let single = SINGLE as f64 / started.elapsed().as_secs_f64();
    table("batched");
    let mut batched = Vec::new();
    for b in 0..BATCHES {
        let changes: Vec<Value> = (0..BATCH)
            .map(|i| json!({"op": "add", "table": "batched", "entry": entry(b * BATCH + i)}))
            .collect();
        let body = json!({ "changes": changes });
        let started = Instant::now();
        client.call("POST", "/api/v1/batch", Some(&body)).unwrap();
        batched.push(BATCH as f64 / started.elapsed().as_secs_f64());
    }
    println!("entries installed through the API:");
    println!("  one POST per entry:       {single:>10.0} entries/s ({SINGLE} entries)");
    println!(
        "  batches of {BATCH}:       {:>10.0} entries/s (median of {BATCHES} batches)",
        median(&mut batched)
    );

    // Forwarding, idle and during a storm, in alternating windows. Every frame goes through
    // `acl` to the exact table the storm changes, and misses there (flooded to port 1).
    client
        .call(
            "POST",
            "/api/v1/tables",
            Some(
                &json!({"name": "storm", "kind": "exact", "key": ["ip_dst"], "miss": ["flood"],
                         "size": 1_000_000}),
            ),
        )
        .unwrap();
    client
        .call(
            "POST",
            "/api/v1/tables/acl/entries",
            Some(&json!({"match": {"ip_dst": "10.9.9.9"}, "actions": [{"goto": "storm"}]})),
        )
        .unwrap();
    let frame = udp_frame(
        &UdpEnds {
            src_mac: Mac([2, 0, 0, 0, 0, 1]),
            dst_mac: Mac([2, 0, 0, 0, 9, 9]),
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 9, 9, 9),
            src_port: 40000,
            dst_port: 9,
        },
        &[&[0u8; 22]],
    );
    let forwarded = Arc::new(AtomicU64::new(0));
    let storming = Arc::new(AtomicBool::new(false));
    // Changes per second the storm makes; 0: as fast as the API takes them.
    let storm_rate = Arc::new(AtomicU64::new(0));
    // Changes the storm has had applied.
    let applied = Arc::new(AtomicU64::new(0));
    let generator = {
        let (stop, forwarded) = (stop.clone(), forwarded.clone());
        std::thread::spawn(move || {
            pin_to(0);
            let frames: Vec<&[u8]> = (0..32).map(|_| &frame[..]).collect();
            let mut rx = Batch::new(64);
            while !stop.load(Ordering::Relaxed) {
                let _ = h0.send(&frames);
                loop {
                    rx.clear();
                    let n = h1.recv(&mut rx).unwrap_or(0);
                    forwarded.fetch_add(n as u64, Ordering::Relaxed);
                    if n < 64 {
                        break;
                    }
                }
                drain(&mut h0, &mut rx);
            }
        })
    };
    let storm = {
        let (stop, storming, storm_rate) = (stop.clone(), storming.clone(), storm_rate.clone());
        let applied = applied.clone();
        std::thread::spawn(move || {
            let client = Client::new(addr, None);
            // The storm's client stands for a controller on another machine: it runs below
            // the forwarding thread, as the API thread does.
            // SAFETY: no pointers; PRIO_PROCESS with a thread id changes this thread alone.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, 10);
            }
            let mut round = 0usize;
            let mut ids: Vec<u64> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if !storming.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let began = Instant::now();
                let mut changes: Vec<Value> = ids
                    .drain(..)
                    .map(|id| json!({"op": "delete", "table": "storm", "id": id}))
                    .collect();
                changes.extend((0..1000).map(|i| {
                    let ip = Ipv4Addr::from(0x0b00_0000 + (round * 1000 + i) as u32);
                    json!({"op": "add", "table": "storm", "entry": {
                        "match": {"ip_dst": ip.to_string()}, "actions": ["drop"]}})
                }));
                let done = client.call("POST", "/api/v1/batch", Some(&json!({"changes": changes})));
                if let Ok(done) = done {
                    applied.fetch_add(done["applied"].as_u64().unwrap_or(0), Ordering::Relaxed);
                    let all: Vec<u64> = done["ids"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_u64)
                        .collect();
                    ids = all[all.len().saturating_sub(1000)..].to_vec();
                }
                round += 1;
                let rate = storm_rate.load(Ordering::Relaxed);
                if rate > 0 {
                    // About 2,000 changes a round (1,000 deletes after the first).
                    let due = Duration::from_secs_f64(2000.0 / rate as f64);
                    std::thread::sleep(due.saturating_sub(began.elapsed()));
                }
            }
        })
    };
    let cost = apply_cost();
    println!(
        "a change applied on the forwarding thread: {cost:.0} ns (median of 50 batches of \
         2,000); at 100,000 changes/s that is {:.1}% of its time",
        cost * 100_000.0 / 1e7
    );
    println!(
        "forwarding (64-byte frames, in-memory ports, medians of {WINDOWS} windows of \
         {WINDOW:?}, idle and storm windows alternating; a storm is batches of 1,000 adds and \
         1,000 deletes in the table every frame is looked up in):"
    );
    for rate in [12_000u64, 50_000, 0] {
        storm_rate.store(rate, Ordering::Relaxed);
        let (mut idle, mut busy, mut changes) = (Vec::new(), Vec::new(), Vec::new());
        for w in 0..WINDOWS * 2 {
            let storm_now = w % 2 == 1;
            storming.store(storm_now, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(50));
            let (start, start_changes) = (
                forwarded.load(Ordering::Relaxed),
                applied.load(Ordering::Relaxed),
            );
            let t = Instant::now();
            std::thread::sleep(WINDOW);
            let got = forwarded.load(Ordering::Relaxed) - start;
            let secs = t.elapsed().as_secs_f64();
            let fps = got as f64 / secs;
            match storm_now {
                true => {
                    busy.push(fps);
                    changes.push((applied.load(Ordering::Relaxed) - start_changes) as f64 / secs);
                }
                false => idle.push(fps),
            }
        }
        let (idle, busy, changes) = (median(&mut idle), median(&mut busy), median(&mut changes));
        let label = match rate {
            0 => "as fast as the API takes them".to_string(),
            r => format!("{r} changes/s"),
        };
        println!(
            "  storm of {label:<30} ({changes:>7.0} applied/s): idle {idle:>9.0} frames/s, \
             storm {busy:>9.0} frames/s, storm / idle {:.2}",
            busy / idle
        );
    }
    storming.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let _ = generator.join();
    let _ = storm.join();
    let _ = forwarder.join();
}

/// Runs the calling thread on CPU `cpu` alone (when the machine has it), so that the frame
/// generator and the forwarding thread each keep a core and the idle rate holds still; the
/// API thread and its client go wherever the scheduler puts them.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it; the call reads
    // it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("cannot pin a thread to CPU {cpu}; figures will be noisier");
        }
    }
}

/// Empties `port`'s queue into `b`, a batch kept for the purpose (a new one each time would
/// cost the generator more than the switch spends on the frames).
fn drain(port: &mut MemPort, b: &mut Batch) {
    b.clear();
    while port.recv(b).unwrap_or(0) > 0 {
        b.clear();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
