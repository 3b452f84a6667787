//! The kvswitch switch application: Ethernet learning and ARP, the parser stage that reads
//! memcached requests to the VIP, key routing over the shared [`pool::Pool`], split multi-key
//! gets, the cache on the UDP path, and the counters an operator reads.
//!
//! Driven, never driving: a [`SwitchSpec`] builds it; frames, instants and a seed come from the
//! caller ([`Switch::process`], [`Switch::tick`]), and [`Switch::poll_at`] says when it next
//! needs time. No I/O, no clock, no thread: the daemon, the tests, the benchmarks and a
//! simulator run the same code, and the same inputs give the same run.
#![forbid(unsafe_code)]

pub mod cache;
pub mod channel;
pub mod control;
pub mod fabric;
pub mod fastpath;
pub mod frame;
pub mod pool;
pub mod qcn;
pub mod ratelimit;
pub mod shaper;
pub mod source;
pub mod spec;
pub mod split;
pub mod stats;
mod switch;
pub mod udp_cache;

pub use spec::{Mode, SpecError, SwitchSpec};
pub use switch::{Dest, Emit, Fate, Snapshot, Switch, TableInfo};
