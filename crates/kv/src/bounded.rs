//! Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam), applied to the
//! points of a ketama ring.
//!
//! Each point of the continuum owns the arc of hashes up to it, and carries the load measured on
//! that arc (requests per second, or any other additive weight). A server may take at most
//! `(1 + ε)` times its share of the total: its weight over the pool's total weight. Points are
//! placed heaviest first; a point goes to its ketama owner when that server has room for it,
//! else to the next server clockwise along the ring that has. A point that fits nowhere (it alone
//! is heavier than any server's room) goes to the server with the most room left.
//!
//! Unlike the paper's per-request form (HAProxy's `hash-balance-factor`), the placement is of
//! arcs, not requests: every key of an arc goes to one server until the placement is computed
//! again, so a key's reads and writes meet on one server. With no load measured, or loads
//! already within the bound, every point stays with its ketama owner.

use crate::route::Ring;

/// Owner of each point of `ring` (in [`Ring::points`] order) under bounded loads.
///
/// `loads[i]` is the load measured on the arc of point `i`; `shares[s]` is server `s`'s weight
/// (1 each for an unweighted pool). Points beyond `loads` count as unloaded. `epsilon` below 0
/// is taken as 0. Deterministic: the same inputs give the same owners.
pub fn bounded_owners(ring: &Ring, loads: &[u64], shares: &[u32], epsilon: f64) -> Vec<u32> {
    let points: Vec<(u32, u32)> = ring.points().collect();
    let natural: Vec<u32> = points.iter().map(|&(_, s)| s).collect();
    let servers = ring.len();
    let load = |i: usize| loads.get(i).copied().unwrap_or(0);
    let total: u128 = (0..points.len()).map(|i| u128::from(load(i))).sum();
    if points.is_empty() || total == 0 {
        return natural;
    }
    let share = |s: usize| u128::from(shares.get(s).copied().unwrap_or(1).max(1));
    let all: u128 = (0..servers).map(share).sum();
    // Room in millionths of a unit of load, so that small loads and ε are not rounded away.
    let factor = 1.0 + epsilon.max(0.0);
    let caps: Vec<u128> = (0..servers)
        .map(|s| {
            let fair = total * 1_000_000 * share(s) / all;
            (fair as f64 * factor).ceil() as u128
        })
        .collect();
    let mut taken = vec![0u128; servers];
    let mut owners = natural.clone();
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| load(b).cmp(&load(a)).then(a.cmp(&b)));
    let mut seen = vec![false; servers];
    for i in order {
        let w = u128::from(load(i)) * 1_000_000;
        if w == 0 {
            // An arc with no load measured stays where ketama puts it.
            continue;
        }
        seen.iter_mut().for_each(|s| *s = false);
        let mut chosen = None;
        let mut asked = 0;
        for k in 0..points.len() {
            let s = natural[(i + k) % points.len()] as usize;
            if std::mem::replace(&mut seen[s], true) {
                continue;
            }
            asked += 1;
            if taken[s] + w <= caps[s] {
                chosen = Some(s);
                break;
            }
            if asked == servers {
                break;
            }
        }
        let s = chosen.unwrap_or_else(|| {
            (0..servers)
                .max_by_key(|&s| (caps[s].saturating_sub(taken[s]), std::cmp::Reverse(s)))
                .unwrap_or(0)
        });
        taken[s] += w;
        owners[i] = s as u32;
    }
    owners
}

/// How far past its bound a placement in force must be before the arcs are placed again, and
/// how much better a new placement must be to be taken: measured loads move a little from one
/// interval to the next, and a placement within the bound is worth keeping.
pub const HYSTERESIS: f64 = 0.05;

/// The load no placement of whole arcs takes below, over the mean: `1 + ε`, or the heaviest arc
/// on the server with the largest share, when that is more.
pub fn reachable(loads: &[u64], shares: &[u32], servers: usize, epsilon: f64) -> f64 {
    let total = loads.iter().fold(0u64, |a, &l| a.saturating_add(l));
    let share = |s: usize| f64::from(shares.get(s).copied().unwrap_or(1).max(1));
    let all: f64 = (0..servers).map(share).sum();
    let largest = (0..servers).map(share).fold(1.0, f64::max);
    let heaviest = loads.iter().copied().max().unwrap_or(0) as f64;
    let arc = match total {
        0 => 0.0,
        t => heaviest / (t as f64 * largest / all),
    };
    (1.0 + epsilon.max(0.0)).max(arc)
}

/// Whether to place the arcs again: the placement in force leaves the busiest server `now`
/// times its share, past what is reachable by more than [`HYSTERESIS`], and the new placement
/// gives `placed`, better by more than it.
pub fn worth_placing(now: f64, placed: f64, reachable: f64) -> bool {
    now > reachable + HYSTERESIS && placed + HYSTERESIS < now
}

/// The owners a placement's moves give the points of `ring`, whose servers are `names` (in
/// ring order): each point's ketama owner, but where a move names the point (by its value)
/// and a server of the ring. Moves of points or servers no longer on the ring are passed over,
/// so a placement outlives a change of the ring where it still applies.
pub fn owners_with_moves(ring: &Ring, names: &[String], moves: &[(u32, String)]) -> Vec<u32> {
    let values: Vec<u32> = ring.points().map(|(v, _)| v).collect();
    let mut owners: Vec<u32> = ring.points().map(|(_, s)| s).collect();
    for (value, name) in moves {
        if let (Ok(i), Some(k)) = (
            values.binary_search(value),
            names.iter().position(|n| n == name),
        ) {
            owners[i] = k as u32;
        }
    }
    owners
}

/// The moves that make `owners` of `ring`'s ketama owners: (point value, server name) for each
/// point whose owner differs.
pub fn moves_of(ring: &Ring, names: &[String], owners: &[u32]) -> Vec<(u32, String)> {
    ring.points()
        .zip(owners)
        .filter(|((_, natural), o)| natural != *o)
        .filter_map(|((v, _), &o)| names.get(o as usize).map(|n| (v, n.clone())))
        .collect()
}

/// Each server's load when `owners` places the points carrying `loads`.
pub fn server_loads(servers: usize, owners: &[u32], loads: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; servers];
    for (i, &s) in owners.iter().enumerate() {
        if let Some(slot) = out.get_mut(s as usize) {
            *slot = slot.saturating_add(loads.get(i).copied().unwrap_or(0));
        }
    }
    out
}

/// The largest server load over the mean (1.0 when the loads are perfectly even; 0 when there
/// is no load).
pub fn max_over_mean(loads: &[u64]) -> f64 {
    let total = loads.iter().fold(0u64, |a, &l| a.saturating_add(l));
    if total == 0 || loads.is_empty() {
        return 0.0;
    }
    let max = loads.iter().copied().max().unwrap_or(0);
    max as f64 * loads.len() as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{Distribution, Server};
    use crate::zipf::Zipf;
    use crate::HashFn;

    fn ring(n: usize) -> Ring {
        let servers: Vec<Server> = (0..n).map(|i| Server::new(format!("s{i}"), 1)).collect();
        Ring::new(Distribution::Ketama, HashFn::Md5, &servers).unwrap()
    }

    /// Per-point loads of a Zipf workload over `keys` keys (request counts per point).
    fn zipf_loads(ring: &Ring, keys: u64, theta: f64) -> Vec<u64> {
        let zipf = Zipf::new(keys, theta);
        let mut loads = vec![0u64; ring.continuum_len()];
        for k in 0..keys {
            let weight = (zipf.share(k + 1) * 1e9) as u64;
            loads[ring.point_index(ring.key_hash(format!("key:{k}").as_bytes()))] += weight;
        }
        loads
    }

    #[test]
    fn no_load_keeps_every_point_with_its_ketama_owner() {
        let r = ring(8);
        let natural: Vec<u32> = r.points().map(|(_, s)| s).collect();
        assert_eq!(bounded_owners(&r, &[], &[], 0.25), natural);
        let even = vec![1u64; r.continuum_len()];
        // ketama's own spread of even arcs is well within 1.5 times the mean.
        assert_eq!(bounded_owners(&r, &even, &[], 0.5), natural);
    }

    #[test]
    fn zipf_loads_are_held_under_one_plus_epsilon_of_the_mean() {
        for servers in [4, 8, 16] {
            let r = ring(servers);
            let loads = zipf_loads(&r, 100_000, 0.99);
            let natural: Vec<u32> = r.points().map(|(_, s)| s).collect();
            let ketama = max_over_mean(&server_loads(servers, &natural, &loads));
            for epsilon in [0.1, 0.25] {
                let owners = bounded_owners(&r, &loads, &[], epsilon);
                let bounded = max_over_mean(&server_loads(servers, &owners, &loads));
                // No placement of whole arcs can beat the heaviest arc (the hottest key's, at
                // 16 servers 1.25 times the mean by itself).
                let total: u64 = loads.iter().sum();
                let heaviest = *loads.iter().max().unwrap() as f64 * servers as f64 / total as f64;
                assert!(
                    bounded <= (1.0 + epsilon).max(heaviest) + 1e-6,
                    "{servers} servers, ε {epsilon}: {bounded} (ketama {ketama})"
                );
                assert!(bounded <= ketama + 1e-9);
            }
        }
    }

    #[test]
    fn a_point_heavier_than_any_room_goes_to_the_server_with_most_room() {
        let r = ring(4);
        let mut loads = vec![1u64; r.continuum_len()];
        loads[7] = 1_000_000;
        let owners = bounded_owners(&r, &loads, &[], 0.1);
        let per = server_loads(4, &owners, &loads);
        // Placed first, when every server has the same room: the lowest numbered takes it, and
        // is then full, so every other point goes to the other three.
        assert_eq!(owners[7], 0);
        assert_eq!(per[0], 1_000_000, "{per:?}");
        assert!(owners.iter().all(|&s| s < 4));
    }

    #[test]
    fn weights_give_a_heavier_server_more_room() {
        let r = ring(2);
        let loads = vec![10u64; r.continuum_len()];
        let owners = bounded_owners(&r, &loads, &[3, 1], 0.0);
        let per = server_loads(2, &owners, &loads);
        let total = per[0] + per[1];
        assert!(per[1] * 4 <= total + 10, "{per:?}");
    }

    #[test]
    fn the_same_loads_give_the_same_owners() {
        let r = ring(8);
        let loads = zipf_loads(&r, 10_000, 0.99);
        assert_eq!(
            bounded_owners(&r, &loads, &[], 0.25),
            bounded_owners(&r, &loads, &[], 0.25)
        );
    }

    #[test]
    fn a_ring_with_owners_places_each_arc_on_its_owner() {
        let r = ring(4);
        let natural: Vec<u32> = r.points().map(|(_, s)| s).collect();
        let same = r.with_owners(&natural).unwrap();
        let mut moved = natural.clone();
        moved[10] = (natural[10] + 1) % 4;
        let other = r.with_owners(&moved).unwrap();
        let mut rng = crate::rng::Xoshiro256StarStar::seed_from_u64(7);
        for _ in 0..20_000 {
            let h = crate::rng::Rng::next_u64(&mut rng) as u32;
            assert_eq!(same.locate_hash(h), r.locate_hash(h));
            let p = r.point_index(h);
            assert_eq!(other.locate_hash(h), moved[p] as usize, "hash {h}");
        }
        // The point's own value is the last hash of its arc.
        let (value, _) = r.points().nth(10).unwrap();
        assert_eq!(other.locate_hash(value), moved[10] as usize);
        assert!(r.with_owners(&natural[1..]).is_err());
        let mut bad = natural.clone();
        bad[0] = 4;
        assert!(r.with_owners(&bad).is_err());
    }
}
