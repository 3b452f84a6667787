//! Key-value logic for kvswitch: which memcached server owns a key, which keys are hot, and
//! when switch rules may change.
//!
//! [`route`] places keys exactly where twemproxy (nutcracker 0.5.0) places them for the same
//! server list, names, weights, distribution and hash, so a fleet can move from twemproxy to
//! kvswitch without a cold cache; plus jump consistent hashing of kvswitch's own. No
//! allocation once a [`Ring`] is built.
//!
//! [`hot`] finds hot keys as SwitchKV does (space-saving and count-min counters, the
//! time-segmented top-k load tracker, the circular-log burst detector, the admission
//! threshold); [`rules`] schedules switch rule updates under a rate limit with SwitchKV's rule
//! buffer; [`cache`] joins them into the in-network cache, kept coherent with writes.
//! [`rng`] is the named generator every seeded draw comes from, and [`zipf`] the key
//! popularity (Zipf ranks, their scrambling over the keyspace, popularity changes) drawn from it. Pure: no I/O, and no clock is
//! read; time is an argument.
#![forbid(unsafe_code)]

pub mod bounded;
pub mod cache;
pub mod expiry;
pub mod fabric;
pub mod hash;
pub mod health;
pub mod hot;
pub mod rate;
pub mod rng;
pub mod route;
pub mod rules;
pub mod switchkv;
pub mod time;
pub mod zipf;

pub use hash::{HashFn, UnknownHash};
pub use route::{
    jump_consistent_hash, ketama_name, Distribution, Ring, RouteError, Server, KETAMA_MAX_HOSTLEN,
    KETAMA_POINTS_PER_SERVER, MAX_STABLE_WEIGHT, MEMCACHED_DEFAULT_PORT,
};
pub use time::Instant;
