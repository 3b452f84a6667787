//! The pools the proxy serves: each a listening address and its servers, with nutcracker's
//! failure-handling options, and the servers' health. The pool itself, shared with the
//! switch's UDP path when the proxy runs inside the switch, is [`switch::pool`]; the files it
//! is read from are the `config` crate's.

pub use switch::pool::{
    Pool, PoolSpec, ServerSpec, View, DEFAULT_FAILURE_LIMIT, DEFAULT_RETRY_TIMEOUT,
    DEFAULT_SERVER_CONNECTIONS, DEFAULT_TIMEOUT,
};
