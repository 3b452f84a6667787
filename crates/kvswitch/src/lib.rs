//! kvswitch: an application-aware software switch for memcached traffic. This crate is the
//! `kvswitch` command line: each subcommand's arguments and the glue that hands them to the
//! crates that do the work — the switch as a running program ([`daemon`]), the proxy
//! ([`proxy`]), the controller ([`controller`]), the network functions ([`nf`]), the
//! simulator ([`sim`]), the testbed and the benches.

pub mod cache_cli;
pub mod ctl;
pub mod demo;
pub mod fabric;
pub mod inc_cli;
pub mod proxy_cli;
pub mod sim_cli;
