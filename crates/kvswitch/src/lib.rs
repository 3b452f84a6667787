//! kvswitch: an application-aware software switch for memcached traffic. This crate is the
//! `kvswitch` command: it joins the switch application ([`switch`]) to real ports through the
//! data plane, starts the proxy ([`proxy`]) and the control API ([`api`]), and dispatches the
//! other subcommands to the crates that implement them.

pub mod api;
pub mod cache;
pub mod cache_cli;
pub mod ctl;
pub mod daemon;
pub mod demo;
pub mod fabric;
pub mod fast;
pub mod inc_cli;
pub mod local;
pub mod proxy_cli;
pub mod sim_cli;
pub mod steer;
