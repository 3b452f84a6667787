//! `kvswitch bench bounded`: consistent hashing with bounded loads against plain ketama, on
//! the ring code the switches route by and the placement the controller computes
//! (`kv::bounded`), over a Zipf workload: the busiest server's load over the mean, and the
//! keys (and the load) that move when a server is added or removed. No processes: the
//! figures are exact for the workload, the same on every machine.
//!
//! A key's load is its Zipf share. The arcs' loads are what the switches would count; the
//! placement is the controller's (heaviest arc first, to the first server clockwise with room
//! under `1 + ε` times the mean). On a change of the servers the switches keep the placement
//! for the points still on the ring, and the controller places the arcs again only when a
//! server is then past what is reachable (`1 + ε`, or the heaviest arc alone) by 0.05 and the
//! new placement is better by as much: both steps' moves are counted.

use std::fmt::Write as _;

use anyhow::bail;
use kv::bounded::{
    bounded_owners, max_over_mean, moves_of, owners_with_moves, reachable, server_loads,
    worth_placing,
};
use kv::route::{Distribution, Server};
use kv::{HashFn, Ring};
use serde::Serialize;

use super::output::{fmt, Machine, Output};
use super::Common;

pub const NAME: &str = "bounded";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Pool sizes, comma-separated [default: 4,8,16,32; 4,8 with --short].
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub servers: Vec<u32>,
    /// Keys in the workload [default: 100000; 10000 with --short].
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub keys: Option<u64>,
    /// The Zipf exponent.
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// The bounds (ε), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "E,...", default_values_t = [0.1, 0.25])]
    pub epsilon: Vec<f64>,
}

impl Args {
    pub fn with(common: Common) -> Args {
        Args {
            common,
            servers: Vec::new(),
            keys: None,
            zipf: 0.99,
            epsilon: vec![0.1, 0.25],
        }
    }

    fn sizes(&self) -> Vec<u32> {
        match (self.servers.is_empty(), self.common.short) {
            (false, _) => self.servers.clone(),
            (true, true) => vec![4, 8],
            (true, false) => vec![4, 8, 16, 32],
        }
    }

    fn keys(&self) -> u64 {
        self.keys
            .unwrap_or(if self.common.short { 10_000 } else { 100_000 })
    }
}

/// One pool size and bound.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub servers: u32,
    pub epsilon: f64,
    /// The busiest server's load over the mean.
    pub ketama_max_over_mean: f64,
    pub bounded_max_over_mean: f64,
    /// The heaviest single arc over the mean: no placement of whole arcs goes below it.
    pub heaviest_arc_over_mean: f64,
    /// Arcs the placement gives to a server other than their ketama owner.
    pub moved_arcs: usize,
    pub arcs: usize,
    /// Keys, and shares of the load, that move when a server is added, then removed.
    pub add: Moved,
    pub remove: Moved,
}

#[derive(Clone, Debug, Serialize)]
pub struct Moved {
    pub ketama_keys: f64,
    pub ketama_load: f64,
    /// From the placement before to the one in force after (both steps).
    pub bounded_keys: f64,
    pub bounded_load: f64,
    /// Whether the controller placed the arcs again after the change.
    pub placed_again: bool,
    /// The busiest server over the mean after the change, bounded loads.
    pub bounded_max_over_mean: f64,
}

#[derive(Serialize)]
struct Results {
    scenario: &'static str,
    settings: serde_json::Value,
    machine: Machine,
    points: Vec<Point>,
}

/// A workload: each key's name hash and load.
struct Workload {
    hashes: Vec<u32>,
    loads: Vec<u64>,
}

fn workload(keys: u64, theta: f64) -> Workload {
    let zipf = kv::zipf::Zipf::new(keys, theta);
    let hash = HashFn::Md5;
    let (mut hashes, mut loads) = (Vec::new(), Vec::new());
    for k in 0..keys {
        hashes.push(hash.hash(format!("key:{k}").as_bytes()));
        // Parts in 10^12 of the whole: exact enough, and integral as the switches' counts are.
        loads.push((zipf.share(k + 1) * 1e12).round() as u64);
    }
    Workload { hashes, loads }
}

/// A pool of `n` equal servers: its ring and their names.
fn pool(n: u32) -> anyhow::Result<(Ring, Vec<String>)> {
    let names: Vec<String> = (1..=n).map(|i| format!("s{i}")).collect();
    let servers: Vec<Server> = names.iter().map(|s| Server::new(s.clone(), 1)).collect();
    Ok((
        Ring::new(Distribution::Ketama, HashFn::Md5, &servers)?,
        names,
    ))
}

/// Each arc's load under `w`.
fn arc_loads(ring: &Ring, w: &Workload) -> Vec<u64> {
    let mut loads = vec![0u64; ring.continuum_len()];
    for (&h, &l) in w.hashes.iter().zip(&w.loads) {
        loads[ring.point_index(h)] += l;
    }
    loads
}

/// Each key's server's name, `owners` placing `ring`'s arcs.
fn key_servers<'a>(ring: &Ring, names: &'a [String], owners: &[u32], w: &Workload) -> Vec<&'a str> {
    w.hashes
        .iter()
        .map(|&h| names[owners[ring.point_index(h)] as usize].as_str())
        .collect()
}

/// The share of keys, and of the load, whose server differs between `a` and `b`.
fn moved(a: &[&str], b: &[&str], w: &Workload) -> (f64, f64) {
    let total: u64 = w.loads.iter().sum();
    let (mut keys, mut load) = (0u64, 0u64);
    for ((x, y), &l) in a.iter().zip(b).zip(&w.loads) {
        if x != y {
            keys += 1;
            load += l;
        }
    }
    (
        keys as f64 / w.hashes.len() as f64,
        load as f64 / total.max(1) as f64,
    )
}

/// The controller's step on a ring: the placement kept, or the arcs placed again when a
/// server is then past its bound.
fn settle(
    ring: &Ring,
    names: &[String],
    kept: &[(u32, String)],
    w: &Workload,
    epsilon: f64,
) -> (Vec<u32>, bool) {
    let loads = arc_loads(ring, w);
    let owners = owners_with_moves(ring, names, kept);
    let now = max_over_mean(&server_loads(ring.len(), &owners, &loads));
    let placed = bounded_owners(ring, &loads, &[], epsilon);
    let after = max_over_mean(&server_loads(ring.len(), &placed, &loads));
    match worth_placing(now, after, reachable(&loads, &[], ring.len(), epsilon)) {
        true => (placed, true),
        false => (owners, false),
    }
}

/// A change from `(ring, names)` with `owners` in force to `(after, after_names)`.
fn change(
    before: (&Ring, &[String], &[u32], &[u32]),
    after: (&Ring, &[String]),
    w: &Workload,
    epsilon: f64,
) -> Moved {
    let (ring, names, natural, owners) = before;
    let (next, next_names) = after;
    let next_natural: Vec<u32> = next.points().map(|(_, s)| s).collect();
    let (ketama_keys, ketama_load) = moved(
        &key_servers(ring, names, natural, w),
        &key_servers(next, next_names, &next_natural, w),
        w,
    );
    let kept = moves_of(ring, names, owners);
    let (settled, placed_again) = settle(next, next_names, &kept, w, epsilon);
    let (bounded_keys, bounded_load) = moved(
        &key_servers(ring, names, owners, w),
        &key_servers(next, next_names, &settled, w),
        w,
    );
    let loads = arc_loads(next, w);
    Moved {
        ketama_keys,
        ketama_load,
        bounded_keys,
        bounded_load,
        placed_again,
        bounded_max_over_mean: max_over_mean(&server_loads(next.len(), &settled, &loads)),
    }
}

fn point(n: u32, epsilon: f64, w: &Workload) -> anyhow::Result<Point> {
    let (ring, names) = pool(n)?;
    let loads = arc_loads(&ring, w);
    let natural: Vec<u32> = ring.points().map(|(_, s)| s).collect();
    let owners = bounded_owners(&ring, &loads, &[], epsilon);
    let total: u64 = loads.iter().sum();
    let heaviest = *loads.iter().max().unwrap_or(&0) as f64 * f64::from(n) / total.max(1) as f64;
    let (grown, grown_names) = pool(n + 1)?;
    let add = change(
        (&ring, &names, &natural, &owners),
        (&grown, &grown_names),
        w,
        epsilon,
    );
    let (shrunk, shrunk_names) = pool(n - 1)?;
    let remove = change(
        (&ring, &names, &natural, &owners),
        (&shrunk, &shrunk_names),
        w,
        epsilon,
    );
    Ok(Point {
        servers: n,
        epsilon,
        ketama_max_over_mean: max_over_mean(&server_loads(ring.len(), &natural, &loads)),
        bounded_max_over_mean: max_over_mean(&server_loads(ring.len(), &owners, &loads)),
        heaviest_arc_over_mean: heaviest,
        moved_arcs: owners.iter().zip(&natural).filter(|(a, b)| a != b).count(),
        arcs: owners.len(),
        add,
        remove,
    })
}

fn summary(points: &[Point], keys: u64, zipf: f64) -> String {
    let pct = |x: f64| fmt(Some(x * 100.0), 1);
    let mut s = format!(
        "# Bounded loads: consistent hashing with bounded loads against ketama\n\n\
         {keys} keys read with Zipf {zipf} popularity, placed by the switches' ketama ring and by \
         the controller's placement of its arcs (`bounded_loads = ε`). Max/mean: the busiest \
         server's load over the mean; the heaviest arc alone bounds what any placement of whole \
         arcs can reach. Add and remove: a server `s(N+1)` added, or `sN` removed; the keys and \
         the share of the load whose server changes, for ketama, and for bounded loads from the \
         placement before to the one in force after (the switches keep the placement's moves \
         whose points are still on the ring; the controller places again only if a server is \
         then past what is reachable, 1 + ε or the heaviest arc, by 0.05 and the new placement \
         is better by as much: \"again\").\n\n\
         | servers | ε | ketama max/mean | bounded max/mean | heaviest arc | arcs moved | add: ketama keys % (load %) | add: bounded keys % (load %) | remove: ketama keys % (load %) | remove: bounded keys % (load %) |\n\
         |--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    );
    for p in points {
        let again = |m: &Moved| if m.placed_again { ", again" } else { "" };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} of {} | {} ({}) | {} ({}){} | {} ({}) | {} ({}){} |",
            p.servers,
            p.epsilon,
            fmt(Some(p.ketama_max_over_mean), 3),
            fmt(Some(p.bounded_max_over_mean), 3),
            fmt(Some(p.heaviest_arc_over_mean), 3),
            p.moved_arcs,
            p.arcs,
            pct(p.add.ketama_keys),
            pct(p.add.ketama_load),
            pct(p.add.bounded_keys),
            pct(p.add.bounded_load),
            again(&p.add),
            pct(p.remove.ketama_keys),
            pct(p.remove.ketama_load),
            pct(p.remove.bounded_keys),
            pct(p.remove.bounded_load),
            again(&p.remove),
        );
    }
    s
}

pub fn run(args: &Args) -> anyhow::Result<Vec<Point>> {
    let sizes = args.sizes();
    if let Some(&n) = sizes.iter().find(|&&n| !(2..=1024).contains(&n)) {
        bail!("--servers: {n}; each size must be 2 to 1024");
    }
    if !(args.zipf > 0.0 && args.zipf.is_finite()) {
        bail!("--zipf: {}; the exponent must be above 0", args.zipf);
    }
    if let Some(e) = args.epsilon.iter().find(|e| !(**e > 0.0 && **e <= 10.0)) {
        bail!("--epsilon: {e}; each bound must be above 0 and at most 10");
    }
    let keys = args.keys();
    let machine = Machine::describe();
    let out = Output::create(&super::bed::out_dir(args.common.out.as_ref(), NAME))?;
    eprintln!("bounded: {keys} keys, Zipf {}...", args.zipf);
    let w = workload(keys, args.zipf);
    let mut points = Vec::new();
    for &n in &sizes {
        for &e in &args.epsilon {
            let p = point(n, e, &w)?;
            eprintln!(
                "  {n:>4} servers  ε {e:<4}  max/mean ketama {:.3}  bounded {:.3}  add: ketama {:.1}% of keys, bounded {:.1}%  remove: ketama {:.1}%, bounded {:.1}%",
                p.ketama_max_over_mean,
                p.bounded_max_over_mean,
                p.add.ketama_keys * 100.0,
                p.add.bounded_keys * 100.0,
                p.remove.ketama_keys * 100.0,
                p.remove.bounded_keys * 100.0,
            );
            points.push(p);
        }
    }
    let results = Results {
        scenario: NAME,
        settings: serde_json::json!({
            "servers": sizes,
            "keys": keys,
            "zipf": args.zipf,
            "epsilon": args.epsilon,
            "short": args.common.short,
        }),
        machine: machine.clone(),
        points: points.clone(),
    };
    out.json(&results)?;
    out.summary(&summary(&points, keys, args.zipf), &machine)?;
    eprintln!("bounded: results in {}", out.dir().display());
    Ok(points)
}
