//! Control-plane errors: everything that can be wrong with a table, entry or selector.
//!
//! The data plane ([`Pipeline::process`](crate::Pipeline::process)) never fails; it reports
//! trouble through [`Verdict::Drop`](crate::Verdict::Drop) reasons and statistics instead.

use crate::action::{CounterId, SelectorId, TableId};
use crate::table::EntryId;
use core::fmt;

/// Why a control-plane call was refused. Nothing is changed when an error is returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No table with this id.
    UnknownTable(TableId),
    /// No live entry with this id in the table (never inserted, or already removed).
    UnknownEntry(TableId, EntryId),
    /// No counter with this id.
    UnknownCounter(CounterId),
    /// No selector with this id.
    UnknownSelector(SelectorId),
    /// The pipeline already holds [`MAX_TABLES`](crate::MAX_TABLES) tables.
    TooManyTables,
    /// Another table already has this name.
    DuplicateTableName(String),
    /// A table key has no fields.
    EmptyKey,
    /// A table key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    KeyTooLong(usize),
    /// A field is malformed: a zero-length byte range or a register index out of range.
    BadField(String),
    /// An entry key (or mask) does not have the table's key length.
    KeyLength { expected: usize, got: usize },
    /// A ternary entry has no mask, or a non-ternary entry has one.
    Mask { required: bool },
    /// An LPM entry has no prefix length, or a non-LPM entry has one.
    Prefix { required: bool },
    /// An LPM prefix length exceeds the key's length in bits.
    PrefixTooLong { prefix_len: u16, max: u16 },
    /// An exact or LPM entry with the same key (and prefix) already exists.
    DuplicateKey(EntryId),
    /// A `Goto` does not go to a later table.
    GotoNotForward { from: TableId, to: TableId },
    /// A `Goto` is followed by other actions, which would never run.
    GotoNotLast,
    /// A selector member contains `Select`.
    NestedSelect,
    /// A `SetReg` names a register out of range.
    BadRegister(u8),
    /// A `Drop` uses a code reserved for the pipeline.
    ReservedReason(u16),
    /// An action list is longer than [`MAX_ACTIONS`](crate::MAX_ACTIONS).
    TooManyActions(usize),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnknownTable(t) => write!(f, "unknown {t}"),
            Error::UnknownEntry(t, e) => write!(f, "unknown entry {e:?} in {t}"),
            Error::UnknownCounter(c) => write!(f, "unknown counter {}", c.0),
            Error::UnknownSelector(s) => write!(f, "unknown selector {}", s.0),
            Error::TooManyTables => write!(f, "too many tables (max {})", crate::MAX_TABLES),
            Error::DuplicateTableName(n) => write!(f, "a table named {n:?} already exists"),
            Error::EmptyKey => write!(f, "table key has no fields"),
            Error::KeyTooLong(n) => {
                write!(f, "table key is {n} bytes (max {})", crate::MAX_KEY_LEN)
            }
            Error::BadField(why) => write!(f, "bad key field: {why}"),
            Error::KeyLength { expected, got } => {
                write!(f, "entry key is {got} bytes, table key is {expected}")
            }
            Error::Mask { required: true } => write!(f, "ternary entry needs a mask"),
            Error::Mask { required: false } => write!(f, "only ternary entries take a mask"),
            Error::Prefix { required: true } => write!(f, "LPM entry needs a prefix length"),
            Error::Prefix { required: false } => write!(f, "only LPM entries take a prefix"),
            Error::PrefixTooLong { prefix_len, max } => {
                write!(
                    f,
                    "prefix length {prefix_len} exceeds key length {max} bits"
                )
            }
            Error::DuplicateKey(e) => write!(f, "entry {e:?} already has this key"),
            Error::GotoNotForward { from, to } => {
                write!(f, "goto from {from} to {to} does not go forward")
            }
            Error::GotoNotLast => write!(f, "goto must be the last action of its list"),
            Error::NestedSelect => write!(f, "selector members may not select"),
            Error::BadRegister(r) => {
                write!(f, "register {r} out of range (have {})", crate::NUM_REGS)
            }
            Error::ReservedReason(r) => write!(
                f,
                "drop reason {r} is reserved for the pipeline (use {} and up)",
                crate::reason::USER_BASE
            ),
            Error::TooManyActions(n) => {
                write!(f, "{n} actions in one list (max {})", crate::MAX_ACTIONS)
            }
        }
    }
}

impl std::error::Error for Error {}
