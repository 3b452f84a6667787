//! Control-plane errors: everything that can be wrong with a table, entry or selector.
//!
//! The data plane ([`Pipeline::process`](crate::Pipeline::process)) never fails; it reports
//! trouble through [`Verdict::Drop`](crate::Verdict::Drop) reasons and statistics instead.

use crate::action::{CounterId, EntryId, SelectorId, TableId};

/// Why a control-plane call was refused. Nothing is changed when an error is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No table with this id.
    #[error("unknown {0}")]
    UnknownTable(TableId),
    /// No live entry with this id in the table (never inserted, or already removed).
    #[error("unknown entry {1:?} in {0}")]
    UnknownEntry(TableId, EntryId),
    /// No counter with this id.
    #[error("unknown counter {}", .0 .0)]
    UnknownCounter(CounterId),
    /// No selector with this id.
    #[error("unknown selector {}", .0 .0)]
    UnknownSelector(SelectorId),
    /// The pipeline already holds [`MAX_TABLES`](crate::MAX_TABLES) tables, or has handed
    /// out every id.
    #[error("too many tables (max {} at once)", crate::MAX_TABLES)]
    TooManyTables,
    /// Another table already has this name.
    #[error("a table named {0:?} already exists")]
    DuplicateTableName(String),
    /// A table key has no fields.
    #[error("table key has no fields")]
    EmptyKey,
    /// A table key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("table key is {0} bytes (max {max})", max = crate::MAX_KEY_LEN)]
    KeyTooLong(usize),
    /// A field is malformed.
    #[error("bad key field: {0}")]
    BadField(FieldError),
    /// An entry key (or mask) does not have the table's key length.
    #[error("entry key is {got} bytes, table key is {expected}")]
    KeyLength { expected: usize, got: usize },
    /// A ternary entry has no mask, or a non-ternary entry has one.
    #[error("{}", if *required { "ternary entry needs a mask" } else { "only ternary entries take a mask" })]
    Mask { required: bool },
    /// An LPM entry has no prefix length, or a non-LPM entry has one.
    #[error("{}", if *required { "LPM entry needs a prefix length" } else { "only LPM entries take a prefix" })]
    Prefix { required: bool },
    /// An LPM prefix length exceeds the key's length in bits.
    #[error("prefix length {prefix_len} exceeds key length {max} bits")]
    PrefixTooLong { prefix_len: u16, max: u16 },
    /// An exact or LPM entry with the same key (and prefix) already exists.
    #[error("entry {0:?} already has this key")]
    DuplicateKey(EntryId),
    /// A `Goto` does not go to a later table.
    #[error("goto from {from} to {to} does not go forward")]
    GotoNotForward { from: TableId, to: TableId },
    /// A `Goto` is followed by other actions, which would never run.
    #[error("goto must be the last action of its list")]
    GotoNotLast,
    /// A selector member contains `Select`.
    #[error("selector members may not select")]
    NestedSelect,
    /// A `SetReg` names a register out of range.
    #[error("register {0} out of range (have {have})", have = crate::NUM_REGS)]
    BadRegister(u8),
    /// A `Drop` uses a code reserved for the pipeline.
    #[error(
        "drop reason {0} is reserved for the pipeline (use {base} and up)",
        base = crate::reason::USER_BASE
    )]
    ReservedReason(u16),
    /// The table holds as many entries as its limit allows.
    #[error("{table} is full ({limit} entries)")]
    TableFull { table: TableId, limit: usize },
    /// A table cannot be removed while an action list elsewhere jumps to it.
    #[error("{table} is the target of a goto in {by}")]
    TableInUse { table: TableId, by: TableId },
    /// A `SetDscp` value does not fit the DSCP's 6 bits.
    #[error("DSCP {0} out of range (0 to 63)")]
    BadDscp(u8),
    /// A `PushLabel` or `SwapLabel` label does not fit an MPLS label's 20 bits.
    #[error("MPLS label {0} out of range (0 to {max})", max = crate::MAX_LABEL)]
    BadLabel(u32),
    /// A `StripUdpPayload` length is odd, 0 or past [`MAX_STRIP`](crate::MAX_STRIP).
    #[error("a UDP strip of {0} bytes; use an even number from 2 to {max}", max = crate::MAX_STRIP)]
    BadStrip(u16),
    /// A `LoadReg` or `AddReg` names a user register out of range.
    #[error("user register {0} out of range (have {have})", have = crate::NUM_USER_REGS)]
    BadUserRegister(u8),
    /// No interface table entry with this id.
    #[error("no interface {0} (ids are 0 to {max})", max = crate::MAX_INTERFACES - 1)]
    UnknownInterface(u16),
    /// An interface table entry cannot be removed while an action list refers to it.
    #[error("interface {interface} is used by an action in {by}")]
    InterfaceInUse { interface: u16, by: String },
    /// No multicast group with this id (or an id past the table).
    #[error("no multicast group {0} (ids are 0 to {max})", max = crate::MAX_GROUPS - 1)]
    UnknownGroup(u16),
    /// A multicast group cannot be removed while an action list refers to it.
    #[error("multicast group {group} is used by an action in {by}")]
    GroupInUse { group: u16, by: String },
    /// A multicast group that names one member twice.
    #[error("{0} is named twice: each member of a multicast group gets one copy")]
    DuplicateMember(crate::Member),
    /// A multicast group with no members, or with more than
    /// [`MAX_GROUP_MEMBERS`](crate::MAX_GROUP_MEMBERS).
    #[error("a multicast group of {0} members; use 1 to {max}", max = crate::MAX_GROUP_MEMBERS)]
    BadGroupSize(usize),
    /// An action list is longer than [`MAX_ACTIONS`](crate::MAX_ACTIONS).
    #[error("{0} actions in one list (max {max})", max = crate::MAX_ACTIONS)]
    TooManyActions(usize),
}

/// Why a key [`Field`](crate::Field) is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    /// A byte range of length zero, at this offset.
    #[error("empty byte range at {offset}")]
    EmptyBytes { offset: u16 },
    /// A metadata register index of [`NUM_REGS`](crate::NUM_REGS) or more.
    #[error("register {0} out of range (have {have})", have = crate::NUM_REGS)]
    Register(u8),
}
