//! Key placement: which server of a pool owns a key.
//!
//! `Ketama` and `Modula` reproduce twemproxy (nutcracker 0.5.0) placement exactly for the same
//! server list, names and weights, so a fleet can move from twemproxy to kvswitch without a
//! cold cache. `Jump` is kvswitch's own. A [`Ring`] is built once (the only place that
//! allocates) and then answers lookups without allocating; it never does I/O.

use core::fmt;
use core::str::FromStr;

use crate::hash::{md5_word, HashFn};

/// Ketama points per server for an average weight, from libmemcached (and so twemproxy's
/// `KETAMA_POINTS_PER_SERVER`), so that key placement matches twemproxy.
pub const KETAMA_POINTS_PER_SERVER: u32 = 160;

/// Points taken from one MD5 digest of `"<name>-<i>"`: its four little-endian words.
const KETAMA_POINTS_PER_HASH: u32 = 4;

/// Size of twemproxy's buffer for `"<name>-<i>"` (`KETAMA_MAX_HOSTLEN`). Longer strings are
/// truncated there while the untruncated length is still hashed, reading past the buffer, so
/// their placement is undefined; [`Ring::new`] refuses names that would need it.
pub const KETAMA_MAX_HOSTLEN: usize = 86;

/// The memcached port that twemproxy leaves out of a server's ketama identity, for
/// compatibility with libmemcached.
pub const MEMCACHED_DEFAULT_PORT: u16 = 11211;

/// One server of a pool, in configuration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// The server's ketama identity; see [`ketama_name`]. Only ketama reads it.
    pub name: String,
    /// Relative weight; must be at least 1, as twemproxy requires.
    pub weight: u32,
}

impl Server {
    /// A server with identity `name` and `weight`.
    pub fn new(name: impl Into<String>, weight: u32) -> Server {
        Server {
            name: name.into(),
            weight,
        }
    }
}

/// The identity twemproxy hashes onto the ketama continuum for a server.
///
/// An explicit `name` (the `- host:port:weight name` form) wins. Otherwise it is the address:
/// `host` alone when `port` is 11211 (libmemcached compatibility), else `"host:port"`. `host`
/// must be spelled as in the twemproxy configuration, since the text itself is hashed.
pub fn ketama_name(host: &str, port: u16, name: Option<&str>) -> String {
    match name {
        Some(name) => name.to_owned(),
        None if port == MEMCACHED_DEFAULT_PORT => host.to_owned(),
        None => format!("{host}:{port}"),
    }
}

/// How keys are spread over a pool's servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// twemproxy's ketama consistent hashing (libmemcached compatible).
    Ketama,
    /// twemproxy's modula: weights expand into slots, servers in twemproxy's (name-sorted)
    /// order; the key's slot is hash % total weight.
    Modula,
    /// Lamping–Veach jump consistent hash over the key hash. kvswitch's own: twemproxy has no
    /// such distribution, so it gives no placement compatibility with twemproxy.
    Jump,
}

impl Distribution {
    /// The configuration name of this distribution.
    pub const fn name(self) -> &'static str {
        match self {
            Distribution::Ketama => "ketama",
            Distribution::Modula => "modula",
            Distribution::Jump => "jump",
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Distribution {
    type Err = RouteError;

    /// Parses `ketama`, `modula` or `jump`. twemproxy's `random` is refused with
    /// [`RouteError::RandomDistribution`]: a cache pool needs a key to stay on one server.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ketama" => Ok(Distribution::Ketama),
            "modula" => Ok(Distribution::Modula),
            "jump" => Ok(Distribution::Jump),
            "random" => Err(RouteError::RandomDistribution),
            other => Err(RouteError::UnknownDistribution(other.to_owned())),
        }
    }
}

/// Why a pool or its configuration was refused. Control-plane only; lookups cannot fail.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The pool has no servers.
    #[error("server pool is empty")]
    EmptyPool,
    /// A server has weight 0 (twemproxy refuses such a configuration).
    #[error("server {server} has weight 0; weights must be at least 1")]
    ZeroWeight {
        /// Index of the server in the pool.
        server: usize,
    },
    /// The weights add up to more than `u32::MAX`.
    #[error("total server weight exceeds 2^32 - 1")]
    WeightOverflow,
    /// Two servers share a name (twemproxy refuses such a pool).
    #[error("servers {first} and {second} have the same name")]
    DuplicateName {
        /// Index of the first server with the name.
        first: usize,
        /// Index of the second server with the name.
        second: usize,
    },
    /// A ketama name is too long for twemproxy's point buffer (see [`KETAMA_MAX_HOSTLEN`]).
    #[error(
        "ketama name of server {server} needs {len} bytes with its point suffix; \
         twemproxy allows at most {max}",
        max = KETAMA_MAX_HOSTLEN - 1
    )]
    NameTooLong {
        /// Index of the server in the pool.
        server: usize,
        /// Length of the longest `"<name>-<i>"` string the server would need.
        len: usize,
    },
    /// A distribution name that is not `ketama`, `modula` or `jump`.
    #[error("unknown distribution {0:?}; expected ketama, modula or jump")]
    UnknownDistribution(String),
    /// A server of a stable ring (see [`Ring::new_stable`]) weighs more than
    /// [`MAX_STABLE_WEIGHT`].
    #[error("server {server} has weight {weight}; a replicated pool takes at most {max}", max = MAX_STABLE_WEIGHT)]
    StableWeight {
        /// Index of the server in the pool.
        server: usize,
        weight: u32,
    },
    /// `random` distribution, which kvswitch does not offer.
    #[error(
        "distribution \"random\" is not supported: a key must map to one server; \
         use ketama, modula or jump"
    )]
    RandomDistribution,
    /// A placement of the ring's points that is not one owner for each ketama point.
    #[error(
        "a placement needs one owner for each of the ring's {points} ketama points; {given} given"
    )]
    Owners {
        /// Points on the ring (0 when it is not ketama).
        points: usize,
        /// Owners given.
        given: usize,
    },
    /// A placement names a server the ring does not have.
    #[error("a placement names server {server}; the ring has {servers}")]
    OwnerOutOfRange {
        /// The server named.
        server: usize,
        /// Servers in the ring.
        servers: usize,
    },
}

/// One point of the ketama continuum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point {
    value: u32,
    server: u32,
}

/// A built pool: maps keys (or key hashes) to server indexes.
///
/// Immutable once built; rebuild it to change the pool. Lookups never allocate and never panic.
#[derive(Clone, Debug)]
pub struct Ring {
    dist: Distribution,
    hash: HashFn,
    servers: usize,
    /// Ketama: the continuum, sorted by value. Empty for other distributions.
    continuum: Vec<Point>,
    /// Ketama: where each slice of the hash space starts on the continuum — entry `b` is the
    /// first point whose value's top `index_bits` bits are at least `b` — so a lookup searches
    /// a few points of one slice rather than the whole continuum.
    index: Vec<u32>,
    index_bits: u32,
    /// Ketama: per slice of the hash space (one to two a point; the top `direct_bits` bits of
    /// a hash pick it), three fields of `direct_server_bits`, `direct_server_bits` and the
    /// rest of the bits, from the top:
    /// - the server of the first point at or after the slice's start (past the last point,
    ///   the first point's);
    /// - when that point lies in the slice and is its only one, the server of the point after
    ///   it (the first point's past the last); when it is one of several, all ones (no server
    ///   has that number); when it lies past the slice, the first field again;
    /// - the top bits of that point's offset in the slice (`direct_drop` low bits dropped), or
    ///   all ones when it lies past the slice.
    ///
    /// A hash whose offset's top bits are below the point's belongs to the first server, above
    /// them to the second, unless that is all ones: most lookups (nine in ten on a ring of
    /// 160 points a server) read one entry of this table and nothing else, where a search
    /// reads `index` and then the continuum, two cache misses on a large ring. Equal top bits
    /// (when bits were dropped) and slices of several points are searched. Four bytes an entry
    /// keep the table small enough to stay cached. Empty when two servers' numbers leave too
    /// few bits for the offset (32,768 servers or more).
    direct: Vec<u32>,
    direct_bits: u32,
    direct_server_bits: u32,
    direct_drop: u32,
    /// Modula and jump: the servers in slot order, as indexes into the caller's list.
    slot_order: Vec<u32>,
    /// Modula and jump: `cumulative[i]` = sum of the weights of `slot_order[0..=i]`, so slot
    /// `s` belongs to the first position whose cumulative weight exceeds `s`.
    cumulative: Vec<u32>,
}

impl Ring {
    /// Builds a pool over `servers`. Indexes returned by lookups are positions in `servers`.
    ///
    /// Server order: twemproxy sorts each pool's servers by name (shorter names first, then
    /// bytewise) while checking for duplicates, and builds its distribution from that sorted
    /// list. Ketama and modula do the same here, so the order in which servers are listed does
    /// not change placement, exactly as in twemproxy; for modula that sorted order is what
    /// decides which slots a server owns. Jump keeps the order given, so appending a server
    /// moves keys only to it.
    ///
    /// Fails when the pool is empty, a weight is 0, the weights overflow `u32`, or (ketama and
    /// modula, which twemproxy refuses) two servers share a name, or (ketama only) a server's
    /// name is too long for twemproxy to hash it reliably.
    pub fn new(dist: Distribution, hash: HashFn, servers: &[Server]) -> Result<Ring, RouteError> {
        if servers.is_empty() {
            return Err(RouteError::EmptyPool);
        }
        // Server indexes are stored as u32; every weight is at least 1, so more servers than
        // that would overflow the total weight anyway.
        if u32::try_from(servers.len()).is_err() {
            return Err(RouteError::WeightOverflow);
        }
        let mut total: u32 = 0;
        for (i, s) in servers.iter().enumerate() {
            if s.weight == 0 {
                return Err(RouteError::ZeroWeight { server: i });
            }
            total = total
                .checked_add(s.weight)
                .ok_or(RouteError::WeightOverflow)?;
        }
        let mut order: Vec<u32> = (0..servers.len() as u32).collect();
        if dist != Distribution::Jump {
            order = twemproxy_order(servers)?;
        }
        let mut ring = Ring {
            dist,
            hash,
            servers: servers.len(),
            continuum: Vec::new(),
            index: Vec::new(),
            index_bits: 0,
            direct: Vec::new(),
            direct_bits: 0,
            direct_server_bits: 0,
            direct_drop: 0,
            slot_order: Vec::new(),
            cumulative: Vec::new(),
        };
        match dist {
            Distribution::Ketama => {
                let points = |s: &Server| ketama_points(s.weight, total, servers.len());
                ring.continuum = build_continuum(servers, &order, points)?;
                ring.build_index();
            }
            Distribution::Modula | Distribution::Jump => {
                let mut sum = 0u32;
                for &i in &order {
                    // Cannot overflow: the same weights summed to `total` above.
                    sum = sum.saturating_add(servers[i as usize].weight);
                    ring.cumulative.push(sum);
                }
                ring.slot_order = order;
            }
        }
        Ok(ring)
    }

    /// A ketama ring whose servers' points do not depend on each other: 160 per unit of
    /// weight (at most [`MAX_STABLE_WEIGHT`]), on the same continuum positions ketama gives a
    /// server of 160 points. Taking a server out of such a ring leaves every other point where
    /// it was, so each of its keys goes to the key's next replica
    /// ([`Ring::replicas_hash`]), whatever the pool's size and weights; in a twemproxy ring
    /// a server's share of points depends on the total weight and the number of servers
    /// (with equal weights, 156 rather than 160 each in pools of 25, 47, 50, ... servers), so
    /// removing one can move the others' points. Replicated pools are built on it; placement
    /// then differs from twemproxy's where twemproxy gives a server other than 160 points per
    /// unit of weight.
    pub fn new_stable(hash: HashFn, servers: &[Server]) -> Result<Ring, RouteError> {
        if let Some((server, s)) = servers
            .iter()
            .enumerate()
            .find(|(_, s)| s.weight > MAX_STABLE_WEIGHT)
        {
            return Err(RouteError::StableWeight {
                server,
                weight: s.weight,
            });
        }
        let mut ring = Ring::new(Distribution::Ketama, hash, servers)?;
        let order = twemproxy_order(servers)?;
        ring.continuum = build_continuum(servers, &order, |s| KETAMA_POINTS_PER_SERVER * s.weight)?;
        ring.build_index();
        Ok(ring)
    }

    /// Slices of about two points each (at most 2^16 of them): the index costs 4 bytes a
    /// slice, and a lookup reads one entry of it and searches one or two points.
    fn build_index(&mut self) {
        let len = self.continuum.len().max(1);
        let bits = (usize::BITS - len.leading_zeros()).clamp(1, 16);
        let shift = 32 - bits;
        let slices = 1usize << bits;
        let mut index = Vec::with_capacity(slices + 1);
        let mut at = 0usize;
        for b in 0..slices {
            while at < self.continuum.len() && ((self.continuum[at].value >> shift) as usize) < b {
                at += 1;
            }
            index.push(at as u32);
        }
        index.push(self.continuum.len() as u32);
        self.index = index;
        self.index_bits = bits;
        self.build_direct();
    }

    /// One to two slices a point (2^18 of them for 1,024 servers of 160 points), at most 2^20.
    fn build_direct(&mut self) {
        self.direct = Vec::new();
        self.direct_bits = 0;
        let Some(first) = self.continuum.first() else {
            return;
        };
        // Server numbers are below 2^w, leaving all ones for "several points".
        let w = usize::BITS - self.servers.leading_zeros();
        if w > 15 {
            return;
        }
        let len = self.continuum.len();
        let bits = (usize::BITS - len.leading_zeros()).clamp(1, 20);
        let shift = 32 - bits;
        let low = u32::MAX >> bits;
        let cut_bits = (32 - 2 * w).min(shift);
        let drop = shift - cut_bits;
        let past = (1u32 << cut_bits) - 1;
        let several = (1u32 << w) - 1;
        let entry = |a: u32, b: u32, cut: u32| (a << (32 - w)) | (b << (32 - 2 * w)) | cut;
        let mut direct = Vec::with_capacity(1 << bits);
        let mut at = 0usize;
        for b in 0..1u32 << bits {
            let start = b << shift;
            while at < len && self.continuum[at].value < start {
                at += 1;
            }
            direct.push(match self.continuum.get(at) {
                Some(p) if p.value >> shift == b => {
                    let after = match self.continuum.get(at + 1) {
                        Some(q) if q.value >> shift == b => several,
                        Some(q) => q.server,
                        None => first.server,
                    };
                    entry(p.server, after, (p.value & low) >> drop)
                }
                Some(p) => entry(p.server, p.server, past),
                None => entry(first.server, first.server, past),
            });
        }
        self.direct = direct;
        self.direct_bits = bits;
        self.direct_server_bits = w;
        self.direct_drop = drop;
    }

    /// The first point of the continuum at or after `hash` (its length when none is).
    fn first_at_or_after(&self, hash: u32) -> usize {
        if self.index.is_empty() {
            return self.continuum.partition_point(|p| p.value < hash);
        }
        let b = (hash >> (32 - self.index_bits)) as usize;
        let (lo, hi) = (self.index[b] as usize, self.index[b + 1] as usize);
        lo + self.continuum[lo..hi].partition_point(|p| p.value < hash)
    }

    /// The key's hash as twemproxy computes it for placement: the pool's hash function, except
    /// that an empty key hashes to 0 (twemproxy does not hash empty keys). twemproxy's
    /// `hash_tag` is not applied; pass the tagged part of the key to get that behaviour.
    pub fn key_hash(&self, key: &[u8]) -> u32 {
        if key.is_empty() {
            0
        } else {
            self.hash.hash(key)
        }
    }

    /// The ketama continuum as (point, server index) in the order [`Ring::locate_hash`]
    /// searches it: the first point at or after a hash owns it, the first point owns hashes
    /// past the last. Empty for other distributions.
    pub fn points(&self) -> impl ExactSizeIterator<Item = (u32, u32)> + '_ {
        self.continuum.iter().map(|p| (p.value, p.server))
    }

    /// The point of the continuum that owns `hash` (its index in [`Ring::points`]): the first
    /// at or after it, the first point past the last. 0 for other distributions.
    pub fn point_index(&self, hash: u32) -> usize {
        let i = self.first_at_or_after(hash);
        if i < self.continuum.len() {
            i
        } else {
            0
        }
    }

    /// The same continuum with each point given to `owners[i]` (in [`Ring::points`] order)
    /// rather than to the server ketama gave it: a placement computed from the ring's own
    /// points, such as [`crate::bounded::bounded_owners`]. Refused for another distribution,
    /// an owner list of another length, or an owner that is not a server of the ring.
    pub fn with_owners(&self, owners: &[u32]) -> Result<Ring, RouteError> {
        if self.dist != Distribution::Ketama || owners.len() != self.continuum.len() {
            return Err(RouteError::Owners {
                points: self.continuum.len(),
                given: owners.len(),
            });
        }
        if let Some(&bad) = owners.iter().find(|&&s| s as usize >= self.servers) {
            return Err(RouteError::OwnerOutOfRange {
                server: bad as usize,
                servers: self.servers,
            });
        }
        let mut ring = self.clone();
        for (p, &s) in ring.continuum.iter_mut().zip(owners) {
            p.server = s;
        }
        ring.build_index();
        Ok(ring)
    }

    /// The index of the server that owns `hash`, in `0..self.len()`.
    pub fn locate_hash(&self, hash: u32) -> usize {
        match self.dist {
            Distribution::Ketama => {
                if self.direct_bits > 0 {
                    let shift = 32 - self.direct_bits;
                    let w = self.direct_server_bits;
                    let entry = self.direct[(hash >> shift) as usize];
                    let cut = entry & (u32::MAX >> (2 * w));
                    let offset = (hash & (u32::MAX >> self.direct_bits)) >> self.direct_drop;
                    // No point between the slice's start and the hash: the slice's first point
                    // (with the lowest index among equal values, as the search finds it).
                    if offset < cut || (offset == cut && self.direct_drop == 0) {
                        return (entry >> (32 - w)) as usize;
                    }
                    // Past the slice's only point: the point after it.
                    let after = (entry >> (32 - 2 * w)) & (u32::MAX >> (32 - w));
                    if offset > cut && after != u32::MAX >> (32 - w) {
                        return after as usize;
                    }
                }
                // First point at or after the hash, wrapping to the first point past the end.
                let i = self.first_at_or_after(hash);
                self.continuum
                    .get(i)
                    .or_else(|| self.continuum.first())
                    .map_or(0, |p| p.server as usize)
            }
            Distribution::Modula => {
                let slots = self.cumulative.last().copied().unwrap_or(1).max(1);
                self.slot_owner(hash % slots)
            }
            Distribution::Jump => {
                let slots = self.cumulative.last().copied().unwrap_or(1).max(1);
                self.slot_owner(jump_consistent_hash(u64::from(hash), slots))
            }
        }
    }

    /// The index of the server that owns `key`, in `0..self.len()`.
    pub fn locate(&self, key: &[u8]) -> usize {
        self.locate_hash(self.key_hash(key))
    }

    /// Number of servers in the pool (never 0).
    pub fn len(&self) -> usize {
        self.servers
    }

    /// Always false: a ring has at least one server.
    pub fn is_empty(&self) -> bool {
        self.servers == 0
    }

    /// The distribution this ring was built with.
    pub fn distribution(&self) -> Distribution {
        self.dist
    }

    /// The key hash function this ring was built with.
    pub fn hash_fn(&self) -> HashFn {
        self.hash
    }

    /// Number of points on the ketama continuum (0 for other distributions).
    pub fn continuum_len(&self) -> usize {
        self.continuum.len()
    }

    /// The `n` servers that hold `hash` in a replicated pool, owner first, into `out`
    /// (cleared first): the owner, then the next distinct servers along the ring (ketama: the
    /// continuum clockwise from the hash; modula and jump: the slot order after the owner's).
    /// Fewer than `n` when the ring has fewer servers. With ketama, taking a server out makes
    /// each of its keys' second replica the owner, and that replica holds every write the key
    /// had.
    pub fn replicas_hash(&self, hash: u32, n: usize, out: &mut Vec<usize>) {
        out.clear();
        let n = n.min(self.servers);
        if n == 0 {
            return;
        }
        match self.dist {
            Distribution::Ketama => {
                let len = self.continuum.len();
                let start = self.first_at_or_after(hash);
                for k in 0..len {
                    let server = self.continuum[(start + k) % len].server as usize;
                    if !out.contains(&server) {
                        out.push(server);
                        if out.len() == n {
                            break;
                        }
                    }
                }
            }
            Distribution::Modula | Distribution::Jump => {
                let owner = self.locate_hash(hash);
                let len = self.slot_order.len();
                let at = self
                    .slot_order
                    .iter()
                    .position(|&s| s as usize == owner)
                    .unwrap_or(0);
                out.extend((0..n).map(|k| self.slot_order[(at + k) % len] as usize));
            }
        }
    }

    /// Owner of a modula/jump slot, `slot < total weight`.
    fn slot_owner(&self, slot: u32) -> usize {
        let i = self.cumulative.partition_point(|&c| c <= slot);
        self.slot_order
            .get(i)
            .or_else(|| self.slot_order.last())
            .map_or(0, |&s| s as usize)
    }
}

/// Points a server gets on the continuum, computed in `f32` exactly as twemproxy does:
/// `floorf(pct * 160 / 4 * n + 0.0000000001) * 4` with `pct = weight / total`. The small
/// constant is a C `double`, so the sum is taken in `f64` and rounded back to `f32` before
/// the floor; every other step rounds to `f32`.
fn ketama_points(weight: u32, total: u32, servers: usize) -> u32 {
    let pct = weight as f32 / total as f32;
    let share =
        pct * KETAMA_POINTS_PER_SERVER as f32 / KETAMA_POINTS_PER_HASH as f32 * servers as f32;
    let nudged = (f64::from(share) + 0.000_000_000_1) as f32;
    // `as` saturates; the value is at most 40 * servers.
    nudged.floor() as u32 * KETAMA_POINTS_PER_HASH
}

/// Number of decimal digits of `n`.
fn decimal_digits(mut n: u32) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// Server indexes in twemproxy's order: sorted by name, shorter names first and equal lengths
/// bytewise (its `string_compare`). Duplicate names are refused, as twemproxy refuses them.
fn twemproxy_order(servers: &[Server]) -> Result<Vec<u32>, RouteError> {
    let mut order: Vec<u32> = (0..servers.len() as u32).collect();
    let name = |i: &u32| {
        let n = servers[*i as usize].name.as_bytes();
        (n.len(), n)
    };
    order.sort_by(|a, b| name(a).cmp(&name(b)));
    for pair in order.windows(2) {
        if name(&pair[0]) == name(&pair[1]) {
            let (a, b) = (pair[0].min(pair[1]), pair[0].max(pair[1]));
            return Err(RouteError::DuplicateName {
                first: a as usize,
                second: b as usize,
            });
        }
    }
    Ok(order)
}

/// Builds twemproxy's ketama continuum: for server `s` and `i` in `0..points/4`, the four
/// little-endian words of MD5(`"<name>-<i>"`) each become a point owned by `s`; then all points
/// are sorted by value. Servers are visited in `order` (twemproxy's) and equal values keep that
/// order (a stable sort, as glibc's merge-sort `qsort` gives twemproxy); such collisions are
/// vanishingly rare.
fn build_continuum(
    servers: &[Server],
    order: &[u32],
    points: impl Fn(&Server) -> u32,
) -> Result<Vec<Point>, RouteError> {
    let mut continuum = Vec::with_capacity(servers.len() * KETAMA_POINTS_PER_SERVER as usize);
    let mut label = Vec::with_capacity(KETAMA_MAX_HOSTLEN);
    for &index in order {
        let server = &servers[index as usize];
        let count = points(server);
        let hashes = count / KETAMA_POINTS_PER_HASH;
        if hashes > 0 {
            let len = server.name.len() + 1 + decimal_digits(hashes - 1);
            if len >= KETAMA_MAX_HOSTLEN {
                return Err(RouteError::NameTooLong {
                    server: index as usize,
                    len,
                });
            }
        }
        for i in 0..hashes {
            label.clear();
            label.extend_from_slice(server.name.as_bytes());
            label.push(b'-');
            label.extend_from_slice(i.to_string().as_bytes());
            for word in 0..KETAMA_POINTS_PER_HASH as usize {
                continuum.push(Point {
                    value: md5_word(&label, word),
                    server: index,
                });
            }
        }
    }
    continuum.sort_by_key(|p| p.value);
    Ok(continuum)
}

/// The heaviest server of a stable ring ([`Ring::new_stable`]): 64 × 160 points.
pub const MAX_STABLE_WEIGHT: u32 = 64;

/// Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014): maps `key`
/// to a bucket in `0..buckets` so that growing from `n` to `n + 1` buckets moves only about
/// `1/(n + 1)` of keys, all to the new bucket. `buckets` must be at least 1.
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_index_finds_what_a_search_of_the_whole_continuum_finds() {
        for n in [1usize, 2, 7, 64, 1024] {
            let servers: Vec<Server> = (0..n)
                .map(|i| {
                    Server::new(
                        format!("10.0.{}.{}:11211", i / 250, i % 250),
                        1 + (i % 3) as u32,
                    )
                })
                .collect();
            let ring = Ring::new(Distribution::Ketama, HashFn::Md5, &servers).unwrap();
            let mut x = 0x1234_5678_u32;
            let points: Vec<u32> = ring.points().map(|(v, _)| v).collect();
            let probes = points
                .iter()
                .flat_map(|&v| [v.wrapping_sub(1), v, v.wrapping_add(1)])
                .chain([0, u32::MAX]);
            for hash in probes.chain((0..20_000).map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            })) {
                let whole = ring.continuum.partition_point(|p| p.value < hash);
                assert_eq!(
                    ring.first_at_or_after(hash),
                    whole,
                    "{n} servers, hash {hash:#x}"
                );
            }
        }
    }

    use super::*;

    fn pool(n: usize, weight: impl Fn(usize) -> u32) -> Vec<Server> {
        (0..n)
            .map(|i| Server::new(format!("10.0.0.{}:{}", i + 1, 11311 + i), weight(i)))
            .collect()
    }

    fn keys(n: usize) -> impl Iterator<Item = Vec<u8>> {
        (0..n).map(|i| format!("key:{i}").into_bytes())
    }

    #[test]
    fn replicas_are_distinct_owner_first_and_survive_a_removal() {
        let servers = pool(5, |_| 1);
        let mut out = Vec::new();
        for dist in [
            Distribution::Ketama,
            Distribution::Modula,
            Distribution::Jump,
        ] {
            let ring = Ring::new(dist, HashFn::Md5, &servers).unwrap();
            for key in keys(500) {
                let hash = ring.key_hash(&key);
                ring.replicas_hash(hash, 3, &mut out);
                assert_eq!(out.len(), 3);
                assert_eq!(out[0], ring.locate_hash(hash), "{dist:?}");
                assert!(out[0] != out[1] && out[1] != out[2] && out[0] != out[2]);
                ring.replicas_hash(hash, 9, &mut out);
                assert_eq!(out.len(), 5, "no more replicas than servers");
                ring.replicas_hash(hash, 0, &mut out);
                assert!(out.is_empty());
            }
        }
        // A stable ring, whatever the pool's size and weights: without a key's owner, its
        // second replica owns it. (A twemproxy ring of 26 gives each server 160 points, of
        // 25 only 156: this would not hold.)
        let servers = pool(26, |i| 1 + (i % 3) as u32);
        let ring = Ring::new_stable(HashFn::Md5, &servers).unwrap();
        for gone in 0..servers.len() {
            let rest: Vec<Server> = (0..servers.len())
                .filter(|&i| i != gone)
                .map(|i| servers[i].clone())
                .collect();
            let smaller = Ring::new_stable(HashFn::Md5, &rest).unwrap();
            for key in keys(300) {
                let hash = ring.key_hash(&key);
                ring.replicas_hash(hash, 2, &mut out);
                if out[0] != gone {
                    continue;
                }
                let next = smaller.locate_hash(hash);
                let next = if next >= gone { next + 1 } else { next };
                assert_eq!(next, out[1]);
            }
        }
    }

    #[test]
    fn ketama_name_rules() {
        assert_eq!(ketama_name("127.0.0.1", 11211, None), "127.0.0.1");
        assert_eq!(ketama_name("127.0.0.1", 11212, None), "127.0.0.1:11212");
        assert_eq!(ketama_name("127.0.0.1", 11211, Some("alpha")), "alpha");
        assert_eq!(ketama_name("cache-a", 22122, Some("beta")), "beta");
    }

    #[test]
    fn distribution_names() {
        for d in [
            Distribution::Ketama,
            Distribution::Modula,
            Distribution::Jump,
        ] {
            assert_eq!(d.to_string().parse::<Distribution>(), Ok(d));
        }
        assert_eq!(
            "random".parse::<Distribution>(),
            Err(RouteError::RandomDistribution)
        );
        assert!(matches!(
            "rendezvous".parse::<Distribution>(),
            Err(RouteError::UnknownDistribution(_))
        ));
    }

    #[test]
    fn rejects_bad_pools() {
        for dist in [
            Distribution::Ketama,
            Distribution::Modula,
            Distribution::Jump,
        ] {
            assert_eq!(
                Ring::new(dist, HashFn::Md5, &[]).err(),
                Some(RouteError::EmptyPool)
            );
            let zero = [Server::new("a", 1), Server::new("b", 0)];
            assert_eq!(
                Ring::new(dist, HashFn::Md5, &zero).err(),
                Some(RouteError::ZeroWeight { server: 1 })
            );
            let big = [Server::new("a", u32::MAX), Server::new("b", 1)];
            assert_eq!(
                Ring::new(dist, HashFn::Md5, &big).err(),
                Some(RouteError::WeightOverflow)
            );
        }
        // 82 bytes + "-39" = 85 fits; one more byte does not.
        let ok = [Server::new("x".repeat(82), 1)];
        assert!(Ring::new(Distribution::Ketama, HashFn::Md5, &ok).is_ok());
        let long = [Server::new("x".repeat(83), 1)];
        assert_eq!(
            Ring::new(Distribution::Ketama, HashFn::Md5, &long).err(),
            Some(RouteError::NameTooLong { server: 0, len: 86 })
        );
        // Names are irrelevant to modula.
        assert!(Ring::new(Distribution::Modula, HashFn::Md5, &long).is_ok());
    }

    #[test]
    fn ketama_continuum_is_160_points_per_equal_server() {
        for n in [1, 2, 3, 4, 5, 8, 10, 16, 32, 64] {
            let ring = Ring::new(Distribution::Ketama, HashFn::Md5, &pool(n, |_| 1)).unwrap();
            assert_eq!(ring.continuum_len(), 160 * n, "{n} servers");
            assert!(ring.continuum.windows(2).all(|w| w[0].value <= w[1].value));
        }
    }

    #[test]
    fn ketama_points_follow_float_arithmetic() {
        // Weights 1,2,3 of 6 over 3 servers: 20, 40, 60 hashes.
        assert_eq!(ketama_points(1, 6, 3), 80);
        assert_eq!(ketama_points(2, 6, 3), 160);
        assert_eq!(ketama_points(3, 6, 3), 240);
        // f32 rounding can land just under a whole number: 1/7 * 160 / 4 * 7 rounds to
        // exactly 40 or just below; whatever twemproxy's floats give, we give.
        let share = (1.0f32 / 7.0) * 160.0 / 4.0 * 7.0;
        assert_eq!(ketama_points(1, 7, 7), share.floor() as u32 * 4);
    }

    #[test]
    fn ketama_point_values_are_md5_words() {
        let ring = Ring::new(Distribution::Ketama, HashFn::Md5, &[Server::new("a", 1)]).unwrap();
        let first = (0..4).map(|w| md5_word(b"a-0", w));
        for v in first {
            assert!(ring.continuum.iter().any(|p| p.value == v));
        }
    }

    #[test]
    fn ketama_lookup_wraps_around() {
        let servers = pool(3, |_| 1);
        let ring = Ring::new(Distribution::Ketama, HashFn::Md5, &servers).unwrap();
        let first = ring.continuum[0];
        let last = ring.continuum[ring.continuum.len() - 1];
        assert_eq!(ring.locate_hash(0), first.server as usize);
        assert_eq!(ring.locate_hash(first.value), first.server as usize);
        assert_eq!(ring.locate_hash(last.value), last.server as usize);
        if last.value < u32::MAX {
            assert_eq!(ring.locate_hash(last.value + 1), first.server as usize);
        }
        // A hash between two points belongs to the later one.
        let (a, b) = (ring.continuum[6], ring.continuum[7]);
        if b.value - a.value > 1 {
            assert_eq!(ring.locate_hash(a.value + 1), b.server as usize);
        }
    }

    #[test]
    fn ketama_lookup_tables_agree_with_a_search_of_the_continuum() {
        for n in [1, 3, 50, 1024] {
            let servers = pool(n, |i| i as u32 % 3 + 1);
            let ring = Ring::new(Distribution::Ketama, HashFn::Md5, &servers).unwrap();
            let search = |hash: u32| {
                let i = ring.continuum.partition_point(|p| p.value < hash);
                ring.continuum.get(i).unwrap_or(&ring.continuum[0]).server as usize
            };
            // Every point and its neighbours (also those that differ from it only in the bits
            // the table drops), the slices' edges, and a spread of hashes.
            let dropped = (1u32 << ring.direct_drop) - 1;
            let mut hashes: Vec<u32> = ring
                .continuum
                .iter()
                .flat_map(|p| {
                    [
                        p.value.wrapping_sub(1),
                        p.value,
                        p.value.wrapping_add(1),
                        p.value & !dropped,
                        p.value | dropped,
                        (p.value | dropped).wrapping_add(1),
                        (p.value & !dropped).wrapping_sub(1),
                    ]
                })
                .collect();
            let shift = 32 - ring.direct_bits;
            for b in 0..1u32 << ring.direct_bits {
                hashes.extend([b << shift, (b << shift) | ((1 << shift) - 1)]);
            }
            hashes.extend((0..100_000u32).map(|i| i.wrapping_mul(0x9e37_79b9)));
            hashes.extend([0, u32::MAX]);
            for h in hashes {
                assert_eq!(ring.locate_hash(h), search(h), "{n} servers, hash {h:#x}");
            }
        }
    }

    #[test]
    fn ketama_weights_shift_share() {
        let servers = pool(3, |i| i as u32 + 1);
        let ring = Ring::new(Distribution::Ketama, HashFn::Md5, &servers).unwrap();
        let mut count = [0usize; 3];
        for k in keys(60_000) {
            count[ring.locate(&k)] += 1;
        }
        // Expected shares 1/6, 2/6, 3/6 of 60,000 keys, within 20%.
        for (i, &c) in count.iter().enumerate() {
            let expect = 10_000 * (i + 1);
            assert!(c.abs_diff(expect) < expect / 5, "{count:?}");
        }
    }

    #[test]
    fn modula_expands_weights_into_slots() {
        let servers = pool(3, |i| i as u32 + 1); // slots: [0, 1, 1, 2, 2, 2]
        let ring = Ring::new(Distribution::Modula, HashFn::Md5, &servers).unwrap();
        let expect = [0, 1, 1, 2, 2, 2];
        for h in 0..60u32 {
            assert_eq!(ring.locate_hash(h), expect[(h % 6) as usize], "hash {h}");
        }
        assert_eq!(ring.locate_hash(u32::MAX), expect[(u32::MAX % 6) as usize]);
        let mut count = [0usize; 3];
        for k in keys(60_000) {
            let h = ring.key_hash(&k);
            let s = ring.locate(&k);
            assert_eq!(s, expect[(h % 6) as usize]);
            count[s] += 1;
        }
        for (i, &c) in count.iter().enumerate() {
            let expect = 10_000 * (i + 1);
            assert!(c.abs_diff(expect) < expect / 10, "{count:?}");
        }
    }

    #[test]
    fn modula_slots_follow_twemproxy_name_order() {
        // twemproxy sorts by (length, bytes): "mid" < "zeta" < "alpha".
        let servers = [
            Server::new("zeta", 1),
            Server::new("alpha", 2),
            Server::new("mid", 3),
        ];
        let ring = Ring::new(Distribution::Modula, HashFn::Md5, &servers).unwrap();
        let expect = [2, 2, 2, 0, 1, 1];
        for h in 0..12u32 {
            assert_eq!(ring.locate_hash(h), expect[(h % 6) as usize], "hash {h}");
        }
        // Jump keeps the order given.
        let jump = Ring::new(Distribution::Jump, HashFn::Md5, &servers).unwrap();
        assert_eq!(jump.slot_order, [0, 1, 2]);
    }

    #[test]
    fn ketama_placement_ignores_listing_order() {
        let servers = pool(4, |i| i as u32 + 1);
        let mut reversed = servers.clone();
        reversed.reverse();
        let a = Ring::new(Distribution::Ketama, HashFn::Md5, &servers).unwrap();
        let b = Ring::new(Distribution::Ketama, HashFn::Md5, &reversed).unwrap();
        for k in keys(5_000) {
            assert_eq!(servers[a.locate(&k)], reversed[b.locate(&k)]);
        }
    }

    #[test]
    fn duplicate_names_are_refused_where_twemproxy_refuses_them() {
        let servers = [
            Server::new("a", 1),
            Server::new("b", 1),
            Server::new("a", 2),
        ];
        for dist in [Distribution::Ketama, Distribution::Modula] {
            assert_eq!(
                Ring::new(dist, HashFn::Md5, &servers).err(),
                Some(RouteError::DuplicateName {
                    first: 0,
                    second: 2
                })
            );
        }
        assert!(Ring::new(Distribution::Jump, HashFn::Md5, &servers).is_ok());
    }

    #[test]
    fn jump_reference_values() {
        // Bucket 0 for one bucket; the key only moves forward as buckets grow.
        for key in [0u64, 1, 42, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(jump_consistent_hash(key, 1), 0);
            let mut prev = 0;
            for n in 2..200 {
                let b = jump_consistent_hash(key, n);
                assert!(b < n);
                assert!(b == prev || b == n - 1, "key {key} n {n}");
                prev = b;
            }
        }
    }

    #[test]
    fn jump_growth_moves_only_to_the_new_server() {
        let keys: Vec<Vec<u8>> = keys(50_000).collect();
        for n in [1usize, 2, 4, 9] {
            let before = Ring::new(Distribution::Jump, HashFn::Md5, &pool(n, |_| 1)).unwrap();
            let after = Ring::new(Distribution::Jump, HashFn::Md5, &pool(n + 1, |_| 1)).unwrap();
            let mut moved = 0usize;
            for k in &keys {
                let (a, b) = (before.locate(k), after.locate(k));
                if a != b {
                    assert_eq!(b, n, "a key moved to an old server");
                    moved += 1;
                }
            }
            let expect = keys.len() / (n + 1);
            assert!(
                moved.abs_diff(expect) < expect / 10,
                "{n} -> {}: moved {moved}, expected about {expect}",
                n + 1
            );
        }
    }

    #[test]
    fn jump_respects_weights() {
        let ring = Ring::new(
            Distribution::Jump,
            HashFn::Murmur,
            &pool(2, |i| 1 + 2 * i as u32),
        )
        .unwrap();
        let mut count = [0usize; 2];
        for k in keys(40_000) {
            count[ring.locate(&k)] += 1;
        }
        assert!(count[0].abs_diff(10_000) < 1_000, "{count:?}");
    }

    #[test]
    fn empty_key_hashes_to_zero_and_single_server_owns_all() {
        let ring = Ring::new(Distribution::Ketama, HashFn::Md5, &pool(3, |_| 1)).unwrap();
        assert_eq!(ring.key_hash(b""), 0);
        for dist in [
            Distribution::Ketama,
            Distribution::Modula,
            Distribution::Jump,
        ] {
            let one = Ring::new(dist, HashFn::Fnv1a64, &pool(1, |_| 5)).unwrap();
            assert_eq!(one.len(), 1);
            assert!(!one.is_empty());
            for k in keys(100) {
                assert_eq!(one.locate(&k), 0);
            }
            assert_eq!(one.locate_hash(u32::MAX), 0);
        }
    }
}
