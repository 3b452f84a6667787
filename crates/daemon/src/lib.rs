//! The switch as a running program: `kvswitch run` ([`run`]) joins the switch application to
//! real ports through the data plane, with its local port into the host's stack ([`local`]),
//! the XDP fast path kept in step with it ([`fast`]), the TCP proxy, the control API
//! ([`api`]), the cache service's view at the edge ([`cache`]) and the check of SwitchKV's
//! cache nodes ([`steer`]); [`fabric`] runs one switch of a caching fabric the same way.

pub mod api;
pub mod cache;
pub mod cpu;
pub mod fabric;
pub mod fast;
pub mod local;
mod run;
pub mod steer;

pub use run::{claim_ports, run};
