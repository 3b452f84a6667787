//! kvswitch: an application-aware software switch for memcached traffic.
//!
//! The switch application ([`switch`]) is driven by frames and time and does no I/O, so tests
//! and benchmarks run it directly; the daemon ([`daemon`]) joins it to real ports, the control
//! API ([`api`]) and signals.

pub mod api;
pub mod bench;
pub mod cache;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod local;
pub mod measure;
pub mod proxy;

pub use ::switch;
pub use switch::{frame, ratelimit, source, split, stats, udp_cache};
