//! What a host speaks to kvswitch's key-value services with: [`fabric`], the client of the
//! caching fabric (IncBricks' client API), and [`memcached`], the probes that ask a memcached
//! (or anything that speaks its protocol: nutcracker, the proxy, the VIP) whether it answers.
#![forbid(unsafe_code)]

pub mod fabric;
pub mod memcached;
