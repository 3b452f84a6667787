//! memcached's side of a server, free of I/O: the item store (flags, expiry, CAS, a memory
//! limit) and the execution of text, meta and binary requests read by the `wire` parser, one
//! request at a time ([`session::step`]). `kvswitch node` serves it over sockets; the
//! simulator and the tests call it directly.
//!
//! Nothing here opens a socket, starts a thread or reads a clock: the time and the process
//! come from the store's [`Host`].
#![forbid(unsafe_code)]

pub mod binary;
mod items;
pub mod session;
pub mod text;

pub use items::{
    bump, parse_counter, read, Counters, DeleteOutcome, Delta, Frozen, Host, Item, Mode, Store,
    StoreOutcome, ITEM_SIZE_MAX,
};
pub use session::{step, Hooks, Step, UdpPath};
pub use text::After;
pub use text::SPILL_AT;

/// The name and version `version` and `stats` report.
pub const VERSION: &str = concat!("kvswitch-node-", env!("CARGO_PKG_VERSION"));
