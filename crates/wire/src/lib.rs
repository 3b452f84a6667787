//! Zero-copy views and builders for every frame kvswitch reads or writes.
//!
//! Views (`Packet<T: AsRef<[u8]>>`) check their length once in `new_checked`, after which no
//! accessor can panic; setters exist only on writable buffers. Nothing here allocates on the
//! packet path and nothing panics on any input.
#![forbid(unsafe_code)]

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod fnv;
pub mod frame;
pub mod inc;
pub mod ipv4;
pub mod keyloc;
pub mod keymac;
pub mod mcudp;
pub mod memcache;
pub mod resp;
pub mod siphash;
pub mod switchkv;
pub mod tcp;
pub mod udp;

mod error;
pub use error::Error;
