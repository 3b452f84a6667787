//! The programmable match-action engine of kvswitch.
//!
//! A [`Pipeline`] is an ordered list of match tables. Each table builds a lookup key from byte
//! ranges of the frame and from caller-provided metadata ([`Meta`]), matches it exactly, by
//! longest prefix or by priority-ordered ternary masks, and runs the matched entry's (or the
//! table's miss) [`Action`]s: rewrites, counters, a load-balancing [`Selector`](Pipeline::add_selector),
//! a jump to a later table, and a terminal decision that becomes the [`Verdict`].
//!
//! The switch's own behaviour (L2 learning and forwarding, ARP for a virtual IP, routing
//! memcached requests to backends) is expressed by the daemon as entries in these tables.
//!
//! This crate is pure: it performs no I/O, reads no clock and never panics on frame contents.
//! [`Pipeline::process`] does not allocate.
//!
//! ```
//! use pipeline::{Action, Entry, Field, MatchKind, Meta, Pipeline, TableSpec, Verdict};
//!
//! let mut p = Pipeline::new();
//! let l2 = p.add_table(TableSpec {
//!     name: "l2".into(),
//!     kind: MatchKind::Exact,
//!     key: vec![Field::Bytes { offset: 0, len: 6 }], // destination MAC
//!     miss: vec![Action::Flood],
//! })?;
//! p.insert(l2, Entry::exact([2, 0, 0, 0, 0, 1], vec![Action::Output(1)]))?;
//!
//! let mut frame = [2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x88, 0xb5];
//! assert_eq!(p.process(&mut frame, &mut Meta::new(3)), Verdict::Output(1));
//! # Ok::<(), pipeline::Error>(())
//! ```
#![forbid(unsafe_code)]

mod action;
mod error;
mod field;
pub mod label;
mod pipeline;
pub mod reason;
mod rewrite;
mod table;

pub use action::{Action, CounterId, EntryId, SelectorId, TableId, Verdict};
pub use error::{Error, FieldError};
pub use field::{Field, Meta};
pub use pipeline::{
    Choose, CounterSnapshot, EntryView, Interface, Member, Pipeline, PipelineStats,
    SelectorSnapshot, Snapshot, TableSnapshot, Taken,
};
pub use table::{Entry, MatchKind, TableSpec};

/// Longest lookup key a table may build, in bytes.
///
/// 64 bytes covers a MAC pair, an IPv4/UDP 5-tuple with metadata and a memcached key hash with
/// room to spare, while keeping the scratch buffers small.
pub const MAX_KEY_LEN: usize = 64;

/// Most tables a pipeline may hold at once.
pub const MAX_TABLES: usize = 256;

/// Most table ids a pipeline hands out in its life (ids of removed tables are not reused, so
/// that a `Goto` never reaches a table it was not written for). Table ids are
/// `0..MAX_TABLE_IDS`.
pub const MAX_TABLE_IDS: usize = u16::MAX as usize;

/// Most actions in one action list (an entry's, a miss, or a selector member's).
///
/// Together with forward-only [`Action::Goto`] and non-nested [`Action::Select`], this bounds
/// the work done per frame.
pub const MAX_ACTIONS: usize = 64;

/// Number of metadata registers in [`Meta::regs`].
pub const NUM_REGS: usize = 9;

/// Number of user registers: state that outlives a frame, read and written by the control
/// plane and by [`Action::LoadReg`] and [`Action::AddReg`].
pub const NUM_USER_REGS: usize = 64;

/// Most entries in the interface table; interface ids are `0..MAX_INTERFACES`.
pub const MAX_INTERFACES: usize = 256;

/// Most entries in the multicast group table ([`Action::Multicast`]); group ids are
/// `0..MAX_GROUPS`.
pub const MAX_GROUPS: usize = 256;

/// Most members of one multicast group: the copies one frame makes.
pub const MAX_GROUP_MEMBERS: usize = 64;

/// The largest value [`Action::SetDscp`] writes: the DSCP is the top 6 bits of the IPv4 ToS
/// byte.
pub const MAX_DSCP: u8 = 63;
/// The largest MPLS label ([`Action::PushLabel`], [`Action::SwapLabel`]): labels are 20 bits.
pub const MAX_LABEL: u32 = (1 << 20) - 1;
/// The longest frame [`Action::PushLabel`] makes; a push past it drops the frame with
/// [`reason::FRAME_TOO_LONG`].
pub const MAX_FRAME_LEN: usize = 16_384;
/// The most bytes [`Action::StripUdpPayload`] removes from a datagram.
pub const MAX_STRIP: u16 = 256;
