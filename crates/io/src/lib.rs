//! The ports of the switch: where frames enter and leave.
//!
//! [`Port`] is the contract the switch loop is written against; [`AfPacket`] implements it on a
//! Linux interface and [`MemPort`] in memory for tests; [`link`] creates the interfaces a port
//! may need, such as the veth pair of a local port into the host's own stack; [`Tun`] is a TUN
//! device, for programs that stand in a host's IP path; [`seqpacket`] is the local channel
//! between a switch and the agents on its CPU path. This crate moves frames and counts
//! them; it never parses or rewrites them. It is the only kvswitch crate with `unsafe` code,
//! each block confined to one system call or C structure.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod afpacket;
mod afxdp;
mod batch;
mod claim;
pub mod clock;
pub mod link;
mod mem;
mod port;
mod ring;
mod sender;
pub mod seqpacket;
pub mod signal;
mod sys;
mod tun;
mod waker;

pub use afpacket::{AfPacket, AfPacketOptions};
pub use afxdp::AfXdp;
pub use batch::{Batch, FRAME_CAP, MAX_BATCH};
pub use claim::{PortClaim, CLAIM_DIR};
pub use link::VethPair;
pub use mem::{mem_pair, MemPort, MEM_QUEUE_LIMIT};
pub use port::{wait_readable, Poller, Port, PortStats};
pub use sender::FrameSender;
pub use tun::Tun;
pub use waker::Waker;
