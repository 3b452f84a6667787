//! What the proxy serves: pools of memcached servers, each behind one listening address, with
//! nutcracker's failure-handling options. The pool itself, shared with the switch's UDP path,
//! is [`switch::pool`].
//!
//! The files a pool comes from are read in [`crate::config`]; their entry points are
//! re-exported here: [`load_toml`] (kvswitch's proxy TOML, or a switch configuration's pool)
//! and [`load_nutcracker`] (a nutcracker YAML file, every pool of it).

pub use crate::config::nutcracker::{load_nutcracker, parse_nutcracker};
pub use crate::config::proxy::{load_toml, parse_toml, ProxyFile, PROXY_EXAMPLE, UNSET_LISTEN};
pub use switch::pool::{
    Pool, PoolSpec, ServerSpec, View, DEFAULT_FAILURE_LIMIT, DEFAULT_RETRY_TIMEOUT,
    DEFAULT_SERVER_CONNECTIONS, DEFAULT_TIMEOUT,
};
