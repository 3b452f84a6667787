//! Actions an entry runs and the verdict a frame ends with.

use core::fmt;

/// Index of a table in its pipeline; table 0 is where processing starts.
///
/// Ids are handed out in order by [`Pipeline::add_table`](crate::Pipeline::add_table). A
/// [`Action::Goto`] may name a table that is not created yet (a miss list is written before the
/// tables after it exist); if it still does not exist when a frame gets there, the frame is
/// dropped with [`reason::BAD_GOTO`](crate::reason::BAD_GOTO).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableId(pub u16);

/// A packet and byte counter created by [`Pipeline::add_counter`](crate::Pipeline::add_counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CounterId(pub u32);

/// A group of action lists with a chooser, created by
/// [`Pipeline::add_selector`](crate::Pipeline::add_selector).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SelectorId(pub u32);

/// Names an entry within its table. Ids of removed entries are never valid again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl EntryId {
    /// The id as one number (generation in the high half), for an API or a log.
    pub fn to_u64(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    /// The id [`EntryId::to_u64`] gave; any other number names no live entry.
    pub fn from_u64(n: u64) -> EntryId {
        EntryId {
            index: n as u32,
            generation: (n >> 32) as u32,
        }
    }
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "table {}", self.0)
    }
}

/// One step of an action list.
///
/// Actions run in order. Terminal actions (`Output`, `Flood`, `ToCpu`, `Drop`, `Interface`,
/// `Multicast`) record the
/// verdict and processing goes on; the last one recorded wins. Processing ends when a list ends
/// without a `Goto`, or when the pipeline itself drops the frame (see [`crate::reason`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send the frame out of this port.
    Output(u16),
    /// Send the frame out of every port but the one it came in on.
    Flood,
    /// Hand the frame to the control plane with a caller-defined reason.
    ToCpu(u16),
    /// Drop the frame. The reason must be at least [`reason::USER_BASE`](crate::reason::USER_BASE).
    Drop(u16),
    /// Add the frame (one packet, `frame.len()` bytes) to a counter.
    Count(CounterId),
    /// Rewrite the Ethernet destination. Skipped (and counted) on frames shorter than 14 bytes.
    SetEthDst([u8; 6]),
    /// Rewrite the Ethernet source. Skipped (and counted) on frames shorter than 14 bytes.
    SetEthSrc([u8; 6]),
    /// Rewrite the IPv4 destination and fix the IPv4, UDP and TCP checksums.
    ///
    /// The IPv4 header, UDP and TCP checksums are updated incrementally (RFC 1624), so a
    /// checksum that was wrong before the rewrite stays wrong after it. A UDP checksum of 0
    /// (absent) stays 0. Non-first fragments carry no L4 header and only get the IPv4 fix.
    /// The caller completes checksums a sender left to offload before the rewrite.
    /// Skipped (and counted) unless the frame is Ethernet II / IPv4 with a valid header length.
    SetIpv4Dst([u8; 4]),
    /// Rewrite the IPv4 source; checksums as for [`Action::SetIpv4Dst`].
    SetIpv4Src([u8; 4]),
    /// Write the IPv4 DSCP (the top 6 bits of the ToS byte; the 2 ECN bits are kept) and fix
    /// the header checksum incrementally (RFC 1624), so a header checksum that was wrong stays
    /// wrong. The value must be below 64 (checked at insertion: [`Error::BadDscp`]).
    /// Skipped (and counted) unless the frame is Ethernet II / IPv4 with a valid header length.
    ///
    /// [`Error::BadDscp`]: crate::Error::BadDscp
    SetDscp(u8),
    /// Decrement the IPv4 TTL and fix the header checksum. A TTL of 0 or 1 drops the frame with
    /// [`reason::TTL_EXPIRED`](crate::reason::TTL_EXPIRED). Skipped (and counted) on non-IPv4.
    DecTtl,
    /// Ask the selector's chooser for a member (given [`Meta::key_hash`](crate::Meta::key_hash))
    /// and run that member's actions. Selector members may not contain `Select`.
    Select(SelectorId),
    /// Continue at a later table; must be the last action of its list. A `Goto` in a selector
    /// member also ends the list that ran the `Select`.
    Goto(TableId),
    /// Set metadata register `n` (< [`NUM_REGS`](crate::NUM_REGS)) for later tables to match on.
    SetReg(u8, u32),
    /// Copy the low 32 bits of user register `user` (< [`NUM_USER_REGS`](crate::NUM_USER_REGS))
    /// into metadata register `reg`: `LoadReg(reg, user)`.
    LoadReg(u8, u8),
    /// Add to user register `n`, wrapping: `AddReg(n, amount)`.
    AddReg(u8, u32),
    /// Send the frame through entry `n` of the interface table: rewrite its Ethernet
    /// destination and source and output it on the interface's port. The entry is read when
    /// the frame runs, so changing it changes every list that names it.
    Interface(u16),
    /// Push an MPLS label stack entry with this label (at most
    /// [`MAX_LABEL`](crate::MAX_LABEL)) in front of the frame's payload, behind its Ethernet
    /// addresses: the ethertype becomes 0x8847, traffic class 0, the TTL is copied from the
    /// label below or the IPv4 TTL (64 otherwise), and the entry is the bottom of the stack
    /// when the frame had no label. The frame grows by 4 bytes (see
    /// [`Pipeline::resized`](crate::Pipeline::resized)); past
    /// [`MAX_FRAME_LEN`](crate::MAX_FRAME_LEN) it is dropped with
    /// [`reason::FRAME_TOO_LONG`](crate::reason::FRAME_TOO_LONG).
    PushLabel(u32),
    /// Pop the top MPLS label. Popping the bottom one gives the frame the ethertype of its
    /// payload, IPv4 or IPv6 by its version; any other payload drops the frame with
    /// [`reason::LABEL_PAYLOAD_UNKNOWN`](crate::reason::LABEL_PAYLOAD_UNKNOWN). A frame with no
    /// label is dropped with [`reason::NO_LABEL`](crate::reason::NO_LABEL). The frame shrinks
    /// by 4 bytes.
    PopLabel,
    /// Replace the top MPLS label's label and decrement its TTL (traffic class and bottom bit
    /// kept), as a label switch does. A frame with no label is dropped with
    /// [`reason::NO_LABEL`](crate::reason::NO_LABEL), one whose label TTL is 0 or 1 with
    /// [`reason::TTL_EXPIRED`](crate::reason::TTL_EXPIRED).
    SwapLabel(u32),
    /// Remove the first `n` bytes (an even number, at most
    /// [`MAX_STRIP`](crate::MAX_STRIP)) of an IPv4 UDP datagram's payload: a shim header the
    /// sender put in front of the application's own, such as kvswitch's key-location header.
    /// The IPv4 total length and the UDP length shrink by `n`, and both checksums are updated
    /// incrementally (RFC 1624), so a checksum that was wrong stays wrong and an absent UDP
    /// checksum stays absent. A frame without such a datagram, or with fewer payload bytes, is
    /// dropped with [`reason::NO_UDP_PAYLOAD`](crate::reason::NO_UDP_PAYLOAD). The frame
    /// shrinks by `n` bytes (see [`Pipeline::resized`](crate::Pipeline::resized)).
    StripUdpPayload(u16),
    /// Send a copy of the frame to every member of entry `n` of the multicast group table
    /// ([`Pipeline::set_group`](crate::Pipeline::set_group)): out of a port as it is, or
    /// through an interface entry with that entry's Ethernet addresses. The group is read
    /// when the frame runs, so changing it changes every list that names it.
    Multicast(u16),
}

impl Action {
    /// Whether this action records a verdict.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Action::Output(_)
                | Action::Flood
                | Action::ToCpu(_)
                | Action::Drop(_)
                | Action::Interface(_)
                | Action::Multicast(_)
        )
    }
}

/// What to do with a frame once it has been through the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Transmit on this port.
    Output(u16),
    /// Transmit on every port but the ingress port.
    Flood,
    /// Hand to the control plane with this caller-defined reason.
    ToCpu(u16),
    /// Drop; codes below [`reason::USER_BASE`](crate::reason::USER_BASE) come from the pipeline.
    Drop(u16),
    /// Send a copy to each member of this multicast group
    /// ([`Pipeline::group`](crate::Pipeline::group)); the caller makes the copies.
    Multicast(u16),
}
