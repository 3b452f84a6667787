//! The switch's run-time control plane, as data: lookup keys, tables, entries and actions in
//! the form the API, `kvswitch ctl` and a controller write them, and their conversion to and
//! from the pipeline's types. [`Switch`](crate::Switch)'s control methods apply them on the
//! forwarding thread. A refused call changes nothing and names the field that is wrong.
//!
//! The memcached program's own tables are listed like any other but only the `acl` table in
//! front of them takes an operator's entries; operators may also create tables of their own
//! and reach them from `acl` with `goto`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

use pipeline::{Action, Entry, Field, MatchKind};
pub use pipeline::{
    MAX_DSCP, MAX_GROUPS, MAX_GROUP_MEMBERS, MAX_INTERFACES, NUM_REGS, NUM_USER_REGS,
};
use wire::ethernet::Mac;

/// The table in front of the memcached program that takes an operator's entries.
pub const ACL: &str = "acl";
/// Entries an operator's table holds unless its definition says otherwise.
pub const DEFAULT_TABLE_SIZE: usize = 65_536;
/// Entries `acl` holds, and a ternary table unless its definition says otherwise: a frame
/// meets a ternary table's entries one after another, so each costs every frame that
/// reaches the table (about 50 ns an entry).
pub const TERNARY_TABLE_SIZE: usize = 4_096;
/// Most entries any operator's table may hold.
pub const MAX_TABLE_SIZE: usize = 1 << 20;
/// Most changes in one batch: a batch is one job on the forwarding thread, and 10,000
/// changes hold it for about 15 ms.
pub const MAX_BATCH: usize = 10_000;
/// Most entries in one page of a listing (one job on the forwarding thread).
pub const MAX_PAGE: usize = 10_000;
/// Frames kept for the CPU (from `to_cpu` and `mirror`) until the control plane reads them;
/// past this they are dropped and counted.
pub const CPU_QUEUE: usize = 1024;
/// Longest table or counter name.
pub const MAX_NAME: usize = 64;
/// The first metadata register an operator's actions may write; the memcached program keeps
/// those below it.
pub const FIRST_OPERATOR_REG: u8 = 3;

/// The program's table an operator writes to steer reads of one key elsewhere (a SwitchKV
/// cache node): exact on `reg1` (1 for a datagram holding one read of one key) and
/// `key_hash`; a miss goes on to the program.
pub const STEER: &str = "kv_steer";

/// The key of [`ACL`]: every named field, so that an entry can match any of them.
pub const ACL_KEY: &[&str] = &[
    "in_port",
    "eth_dst",
    "eth_src",
    "ethertype",
    "ip_proto",
    "ip_src",
    "ip_dst",
    "l4_src",
    "l4_dst",
    "key_hash",
    "mc_request",
    "l4_payload",
    "ip_tos",
];

/// The fields the API knows by name: the Ethernet, IPv4 and UDP/TCP headers at their usual
/// offsets, the first 16 bytes of a memcached UDP request (zero past the frame's end), the
/// in-port and the ring's hash of the request's key.
pub const NAMED_FIELDS: &[(&str, Field, &str)] = &[
    (
        "eth_dst",
        Field::Bytes { offset: 0, len: 6 },
        "Ethernet destination",
    ),
    (
        "eth_src",
        Field::Bytes { offset: 6, len: 6 },
        "Ethernet source",
    ),
    (
        "ethertype",
        Field::Bytes { offset: 12, len: 2 },
        "Ethernet type",
    ),
    (
        "ip_proto",
        Field::Bytes { offset: 23, len: 1 },
        "IPv4 protocol",
    ),
    ("ip_src", Field::Bytes { offset: 26, len: 4 }, "IPv4 source"),
    (
        "ip_dst",
        Field::Bytes { offset: 30, len: 4 },
        "IPv4 destination",
    ),
    (
        "l4_src",
        Field::Bytes { offset: 34, len: 2 },
        "UDP or TCP source port",
    ),
    (
        "l4_dst",
        Field::Bytes { offset: 36, len: 2 },
        "UDP or TCP destination port",
    ),
    (
        "ip_tos",
        Field::Bytes { offset: 15, len: 1 },
        "the IPv4 ToS byte: the DSCP in its top 6 bits (match DSCP D as D << 2 under the mask \
         0xfc), ECN in the low 2",
    ),
    (
        "l4_payload",
        Field::Padded { offset: 42, len: 8 },
        "the first 8 bytes after a UDP header (IPv4 without options), zero-padded: a request id \
         or tag a network function matches on",
    ),
    (
        "mpls",
        Field::Bytes { offset: 14, len: 4 },
        "the top MPLS label stack entry: label (20 bits), traffic class (3), bottom of stack \
         (1), TTL (8); match a label L as (L << 12) under the mask 0xfffff000",
    ),
    (
        "mc_request",
        Field::Padded {
            offset: 50,
            len: 16,
        },
        "first 16 bytes of a memcached UDP request (after its frame header), zero-padded",
    ),
    ("in_port", Field::InPort, "port the frame came in on"),
    (
        "key_hash",
        Field::KeyHash,
        "the ring's hash of a memcached request's key (0 if none)",
    ),
];

/// One field of a lookup key: a name from [`NAMED_FIELDS`], a byte range of the frame, or
/// metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(untagged))]
pub enum KeyField {
    Named(String),
    Bytes {
        name: String,
        offset: u16,
        len: u8,
        /// Bytes past the frame's end read as zero instead of making the table miss.
        #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_false"))]
        padded: bool,
    },
    Meta {
        name: String,
        meta: MetaField,
    },
}

#[cfg(feature = "serde")]
fn is_false(b: &bool) -> bool {
    !*b
}

/// Metadata a key may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MetaField {
    InPort,
    KeyHash,
    /// The memcached program's flags (shown in its tables).
    Flags,
    Reg0,
    Reg1,
    Reg2,
    Reg3,
    Reg4,
    Reg5,
    Reg6,
    Reg7,
}

impl MetaField {
    fn field(self) -> Field {
        match self {
            MetaField::InPort => Field::InPort,
            MetaField::KeyHash => Field::KeyHash,
            MetaField::Flags => Field::Flags,
            MetaField::Reg0 => Field::Reg(0),
            MetaField::Reg1 => Field::Reg(1),
            MetaField::Reg2 => Field::Reg(2),
            MetaField::Reg3 => Field::Reg(3),
            MetaField::Reg4 => Field::Reg(4),
            MetaField::Reg5 => Field::Reg(5),
            MetaField::Reg6 => Field::Reg(6),
            MetaField::Reg7 => Field::Reg(7),
        }
    }
}

/// How a table matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Kind {
    Exact,
    Lpm,
    Ternary,
}

impl From<Kind> for MatchKind {
    fn from(k: Kind) -> MatchKind {
        match k {
            Kind::Exact => MatchKind::Exact,
            Kind::Lpm => MatchKind::Lpm,
            Kind::Ternary => MatchKind::Ternary,
        }
    }
}

impl From<MatchKind> for Kind {
    fn from(k: MatchKind) -> Kind {
        match k {
            MatchKind::Exact => Kind::Exact,
            MatchKind::Lpm => Kind::Lpm,
            MatchKind::Ternary => Kind::Ternary,
        }
    }
}

/// A table to create.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct TableDef {
    pub name: String,
    pub kind: Kind,
    pub key: Vec<KeyField>,
    /// What runs when no entry matches; nothing (the frame is dropped as `no_action`) if
    /// empty.
    #[cfg_attr(feature = "serde", serde(default))]
    pub miss: Vec<ActionDef>,
    /// Most entries; [`DEFAULT_TABLE_SIZE`] if not given ([`TERNARY_TABLE_SIZE`] for a
    /// ternary table).
    #[cfg_attr(feature = "serde", serde(default))]
    pub size: Option<usize>,
}

/// One action as the API writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ActionDef {
    /// Send out of this port.
    Output(u16),
    /// Send out of every port but the one it came in on.
    Flood,
    /// Hand to the control plane (read with `GET /api/v1/packets`) instead of forwarding.
    ToCpu,
    /// Hand a copy to the control plane and forward as usual.
    Mirror,
    /// Drop, counted as `operator`.
    Drop,
    /// Count packets and bytes in the named counter (created on first use).
    Count(String),
    SetEthDst(String),
    SetEthSrc(String),
    SetIpv4Dst(Ipv4Addr),
    SetIpv4Src(Ipv4Addr),
    /// Write the IPv4 DSCP (0 to 63, the top 6 bits of the ToS byte; the ECN bits are kept)
    /// and fix the header checksum. Match it with a byte range at offset 15 of length 1 under
    /// the mask `0xfc`.
    SetDscp(u8),
    /// Decrement the IPv4 TTL; a frame whose TTL runs out is dropped.
    DecTtl,
    /// Go on at a later table.
    Goto(String),
    /// Send through this entry of the interface table (its MACs, its port).
    Interface(u16),
    /// Send a copy to each member of this entry of the multicast group table.
    Multicast(u16),
    /// Set a metadata register (3 to 7) for a later table's key.
    SetReg {
        reg: u8,
        value: u32,
    },
    /// Copy the low 32 bits of a user register into a metadata register (3 to 7).
    LoadReg {
        reg: u8,
        register: u8,
    },
    /// Add to a user register.
    AddRegister {
        register: u8,
        value: u32,
    },
    /// Push an MPLS label (0 to 1,048,575) on top of the frame's label stack: ethertype
    /// 0x8847, TTL copied from the label below or the IPv4 TTL. Match the top label with the
    /// `mpls` field.
    PushLabel(u32),
    /// Pop the top MPLS label; the bottom one gives the frame back its IPv4 or IPv6 ethertype.
    /// A frame with no label is dropped (`no_label`).
    PopLabel,
    /// Replace the top MPLS label's label and decrement its TTL (one that runs out drops the
    /// frame).
    SwapLabel(u32),
    /// Remove the first N bytes (even, 2 to 256) of a UDP datagram's payload, such as a shim
    /// header in front of the application's own, with the IPv4 and UDP lengths and checksums
    /// updated. A frame without a UDP payload that long is dropped (`no_udp_payload`).
    StripUdpPayload(u16),
    /// Impair the frames the entry matches as a faulty link would, for tests of what runs
    /// over it: see [`ImpairDef`].
    Impair(ImpairDef),
    /// An action of the memcached program that only it writes, described.
    Program(String),
}

/// A faulty link, as the `impair` action writes it. Of the frames that would leave, a share
/// `drop_ppm` (parts per million) is dropped (`impaired`), a share `duplicate_ppm` sent twice,
/// a share `reorder_ppm` held back `reorder_us` more than the rest so that later frames pass
/// it, and every frame kept waits `delay_us` first. Each frame draws from the switch's own
/// seeded generator, so a run is replayed by its seed. The shares add up to at most a million;
/// a delay is at most a second. Held frames are bounded ([`MAX_IMPAIRED_HELD`]); past that a
/// frame asked to wait is dropped as `impaired`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct ImpairDef {
    pub drop_ppm: u32,
    pub duplicate_ppm: u32,
    pub reorder_ppm: u32,
    pub delay_us: u32,
    pub reorder_us: u32,
}

/// The most frames the `impair` actions hold at once.
pub const MAX_IMPAIRED_HELD: usize = 4096;
/// The most different `impair` actions a switch holds.
pub const MAX_IMPAIRMENTS: usize = 256;
/// The longest an `impair` action delays a frame, in microseconds.
pub const MAX_IMPAIR_DELAY_US: u32 = 1_000_000;

/// An entry of the interface table as the API writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct InterfaceDef {
    pub eth_dst: String,
    pub eth_src: String,
    pub port: u16,
}

/// An entry of the interface table as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct InterfaceView {
    pub id: u16,
    pub eth_dst: String,
    pub eth_src: String,
    pub port: u16,
    /// Entries, miss lists and selector members whose actions name it, and multicast groups
    /// it is a member of.
    pub used_by: usize,
}

/// A member of a multicast group: where one copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MemberDef {
    /// Out of this port, as the frame is.
    Port(u16),
    /// Through this entry of the interface table (its MACs, its port).
    Interface(u16),
}

/// An entry of the multicast group table as the API writes it: 1 to 64 members, a copy of
/// the frame for each, in order. A member on the port the frame came in by gets no copy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct GroupDef {
    pub members: Vec<MemberDef>,
}

/// An entry of the multicast group table as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GroupView {
    pub id: u16,
    pub members: Vec<MemberDef>,
    /// Entries, miss lists and selector members whose actions name it.
    pub used_by: usize,
}

/// A register as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RegisterView {
    /// `user0` to `user63`, or `port<N>.<what>` for a port's figures.
    pub name: String,
    pub value: u64,
    pub writable: bool,
}

/// The name of user register `n`.
pub fn user_register_name(n: usize) -> String {
    format!("user{n}")
}

/// The refusal of a register name that names none.
pub fn no_register(name: &str) -> ControlError {
    ControlError::new(
        ErrorKind::NotFound,
        "name",
        format!(
            "no register {name:?}: user registers are user0 to user{}, port figures \
             port<N>.<figure> (GET /api/v1/registers lists them)",
            pipeline::NUM_USER_REGS - 1
        ),
    )
}

/// The user register a name denotes: `user<N>` with N below `NUM_USER_REGS`.
pub fn user_register(name: &str) -> Option<u8> {
    let n: usize = name.strip_prefix("user")?.parse().ok()?;
    (n < pipeline::NUM_USER_REGS && name == user_register_name(n)).then_some(n as u8)
}

/// A value for one field of an entry's match.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(untagged))]
pub enum Value {
    /// Big-endian in the field's width.
    Number(u64),
    /// An IPv4 address (4-byte fields), a MAC (6-byte fields), or `0x` and hex digits.
    Text(String),
    /// A value under a mask (ternary tables only).
    Masked { value: Box<Value>, mask: Box<Value> },
    /// Bytes of text from the field's start, zero after; in a ternary table only those
    /// bytes are matched (so `{"text": "get user:"}` matches a key prefix in `mc_request`).
    Literal { text: String },
}

/// An entry to add.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct EntryDef {
    /// Field name → value. Exact tables need every field; in ternary tables a field left
    /// out matches anything; in LPM tables fields past the prefix may be left out.
    #[cfg_attr(feature = "serde", serde(rename = "match", default))]
    pub fields: BTreeMap<String, Value>,
    /// Ternary tables: the highest priority that matches wins, then the oldest entry.
    #[cfg_attr(feature = "serde", serde(default))]
    pub priority: u32,
    /// LPM tables: how many leading bits of the whole key must match.
    #[cfg_attr(feature = "serde", serde(default))]
    pub prefix_len: Option<u16>,
    pub actions: Vec<ActionDef>,
}

/// One change of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)
)]
pub enum Change {
    Add {
        table: String,
        entry: EntryDef,
    },
    /// Replace an entry's actions, keeping its match and hits.
    Modify {
        table: String,
        id: u64,
        actions: Vec<ActionDef>,
    },
    Delete {
        table: String,
        id: u64,
    },
}

impl Change {
    /// The table it changes.
    pub fn table(&self) -> &str {
        match self {
            Change::Add { table, .. }
            | Change::Modify { table, .. }
            | Change::Delete { table, .. } => table,
        }
    }
}

/// A table as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TableView {
    pub name: String,
    pub kind: Kind,
    pub key: Vec<KeyField>,
    /// Key width in bytes.
    pub key_len: usize,
    pub miss: Vec<ActionDef>,
    pub size: Option<usize>,
    pub entries: usize,
    pub hits: u64,
    pub misses: u64,
    /// `program` (the memcached program's own, read-only) or `operator`.
    pub owner: String,
    /// Whether entries may be added, changed and deleted through the API.
    pub writable: bool,
}

/// An entry as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EntryView {
    pub id: u64,
    #[cfg_attr(feature = "serde", serde(rename = "match"))]
    pub fields: BTreeMap<String, Value>,
    pub priority: u32,
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub prefix_len: Option<u16>,
    pub actions: Vec<ActionDef>,
    pub hits: u64,
}

/// A counter an operator's `count` action feeds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CounterView {
    pub name: String,
    pub packets: u64,
    pub bytes: u64,
}

/// A port and its counters as the API lists them. Every figure but `port` is also a
/// read-only register `port<N>.<figure>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PortView {
    pub port: u16,
    /// The interface it runs on, when the switch knows it.
    pub name: Option<String>,
    pub mac: Option<String>,
    /// `af_packet`, or the XDP mode the port runs in.
    pub datapath: String,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Frames its egress queue had no room for.
    pub tx_dropped: u64,
    /// What waits in its egress queue.
    pub queue_bytes: u64,
    pub queue_packets: u64,
    /// Its egress queue's rate (0: it sends at once), where the switch has egress queues.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub egress_rate_bps: Option<u64>,
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub egress_depth_bytes: Option<u64>,
}

/// A frame an entry handed to the CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CpuFrame {
    pub in_port: u16,
    /// `to_cpu` or `mirror`.
    pub reason: String,
    /// The frame in hex.
    pub frame: String,
}

/// A frame an entry handed to the CPU, as the switch queues it: the bytes as they are, so
/// that the forwarding thread does not format them (see [`CpuPacket::view`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuPacket {
    pub in_port: u16,
    /// `to_cpu` or `mirror`.
    pub reason: &'static str,
    pub frame: Vec<u8>,
}

impl CpuPacket {
    /// The frame as the API shows it.
    pub fn view(&self) -> CpuFrame {
        CpuFrame {
            in_port: self.in_port,
            reason: self.reason.to_string(),
            frame: hex(&self.frame),
        }
    }
}

/// What kind of refusal, which the API turns into a status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ErrorKind {
    /// Malformed: a bad value, width, name or action.
    Invalid,
    /// No such table or entry.
    NotFound,
    /// Clashes with what is there: a duplicate key, a table in use, a read-only table.
    Conflict,
    /// A table or queue at its limit.
    Full,
}

/// Why a control call was refused; nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ControlError {
    pub kind: ErrorKind,
    /// Where in the request: `changes[3].entry.match.ip_dst`, `key[1].len`, ...
    pub field: String,
    pub error: String,
}

impl ControlError {
    pub fn new(kind: ErrorKind, field: impl Into<String>, error: impl Into<String>) -> Self {
        ControlError {
            kind,
            field: field.into(),
            error: error.into(),
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, error: impl Into<String>) -> Self {
        ControlError::new(ErrorKind::Invalid, field, error)
    }

    /// The same error, its field placed under `outer`.
    pub fn within(mut self, outer: &str) -> Self {
        self.field = match self.field.is_empty() {
            true => outer.to_string(),
            false if self.field.starts_with('[') => format!("{outer}{}", self.field),
            false => format!("{outer}.{}", self.field),
        };
        self
    }
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.field.is_empty() {
            true => write!(f, "{}", self.error),
            false => write!(f, "{}: {}", self.field, self.error),
        }
    }
}

impl std::error::Error for ControlError {}

/// Checks a table or counter name: 1 to [`MAX_NAME`] of `a-z`, `0-9`, `_` and `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{name:?} is not a name: use 1 to {MAX_NAME} of a-z, 0-9, _ and -"
        )),
    }
}

/// A key field's name and what the pipeline reads for it.
pub fn resolve_field(f: &KeyField) -> Result<(String, Field), ControlError> {
    match f {
        KeyField::Named(name) => NAMED_FIELDS
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(n, field, _)| (n.to_string(), *field))
            .ok_or_else(|| {
                let known: Vec<&str> = NAMED_FIELDS.iter().map(|(n, _, _)| *n).collect();
                ControlError::invalid(
                    "",
                    format!("unknown field {name:?}; known: {}", known.join(", ")),
                )
            }),
        KeyField::Bytes {
            name,
            offset,
            len,
            padded,
        } => {
            check_name(name).map_err(|e| ControlError::invalid("name", e))?;
            if *len == 0 {
                return Err(ControlError::invalid(
                    "len",
                    "a byte range needs 1 byte or more",
                ));
            }
            let field = match padded {
                true => Field::Padded {
                    offset: *offset,
                    len: *len,
                },
                false => Field::Bytes {
                    offset: *offset,
                    len: *len,
                },
            };
            Ok((name.clone(), field))
        }
        KeyField::Meta { name, meta } => {
            check_name(name).map_err(|e| ControlError::invalid("name", e))?;
            Ok((name.clone(), meta.field()))
        }
    }
}

/// How a pipeline field is shown: by its name if it has one.
pub fn describe_field(field: Field, i: usize) -> KeyField {
    if let Some((n, _, _)) = NAMED_FIELDS.iter().find(|(_, f, _)| *f == field) {
        return KeyField::Named(n.to_string());
    }
    let meta = |meta| KeyField::Meta {
        name: format!("f{i}"),
        meta,
    };
    match field {
        Field::Bytes { offset, len } | Field::Padded { offset, len } => KeyField::Bytes {
            name: format!("f{i}"),
            offset,
            len,
            padded: matches!(field, Field::Padded { .. }),
        },
        Field::InPort => meta(MetaField::InPort),
        Field::KeyHash => meta(MetaField::KeyHash),
        Field::Flags => meta(MetaField::Flags),
        Field::Reg(n) => meta(match n {
            0 => MetaField::Reg0,
            1 => MetaField::Reg1,
            2 => MetaField::Reg2,
            3 => MetaField::Reg3,
            4 => MetaField::Reg4,
            5 => MetaField::Reg5,
            6 => MetaField::Reg6,
            _ => MetaField::Reg7,
        }),
    }
}

/// The name a key field goes by in entries.
pub fn field_name(f: &KeyField) -> &str {
    match f {
        KeyField::Named(n) => n,
        KeyField::Bytes { name, .. } | KeyField::Meta { name, .. } => name,
    }
}

/// Bytes of `width` for one field's value, with the mask it implies (all ones unless a
/// literal or an explicit mask says otherwise).
fn value_bytes(v: &Value, width: usize, mask_ok: bool) -> Result<(Vec<u8>, Vec<u8>), String> {
    let full = vec![0xff; width];
    match v {
        Value::Number(n) => {
            let bytes = n.to_be_bytes();
            let cut = 8usize.saturating_sub(width);
            if width < 8 && n >> (8 * width) != 0 {
                return Err(format!("{n} does not fit in {width} bytes"));
            }
            let mut out = vec![0u8; width.saturating_sub(8)];
            out.extend_from_slice(&bytes[cut..]);
            Ok((out, full))
        }
        Value::Text(s) => {
            if let Some(hex) = s.strip_prefix("0x") {
                let digits = hex.len();
                if digits == 0 || digits > 2 * width || !hex.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    return Err(format!("{s:?} is not 0x and 1 to {} hex digits", 2 * width));
                }
                let padded = format!("{hex:0>w$}", w = 2 * width);
                let out = (0..width)
                    .map(|i| u8::from_str_radix(&padded[2 * i..2 * i + 2], 16).unwrap_or(0))
                    .collect();
                return Ok((out, full));
            }
            if width == 4 {
                if let Ok(ip) = s.parse::<Ipv4Addr>() {
                    return Ok((ip.octets().to_vec(), full));
                }
            }
            if width == 6 {
                if let Ok(mac) = s.parse::<Mac>() {
                    return Ok((mac.0.to_vec(), full));
                }
            }
            Err(format!(
                "{s:?} is not a value for a {width}-byte field: give a number, 0x and hex \
                 digits{}{}, or {{\"text\": ...}}",
                if width == 4 { ", an IPv4 address" } else { "" },
                if width == 6 { ", a MAC address" } else { "" },
            ))
        }
        Value::Literal { text } => {
            let bytes = text.as_bytes();
            if bytes.len() > width {
                return Err(format!(
                    "text of {} bytes does not fit in {width} bytes",
                    bytes.len()
                ));
            }
            let mut value = vec![0u8; width];
            value[..bytes.len()].copy_from_slice(bytes);
            let mut mask = vec![0u8; width];
            mask[..bytes.len()].fill(0xff);
            Ok((value, if mask_ok { mask } else { full }))
        }
        Value::Masked { value, mask } => {
            if !mask_ok {
                return Err("only ternary tables take masks".into());
            }
            let (value, _) = value_bytes(value, width, false)?;
            let (mask, _) = value_bytes(mask, width, false).map_err(|e| format!("mask: {e}"))?;
            Ok((value, mask))
        }
    }
}

/// Builds the pipeline entry for `def` in a table of `kind` keyed by `fields` (name, field).
/// Actions are converted by the caller.
pub fn build_entry(
    def: &EntryDef,
    kind: MatchKind,
    fields: &[(String, Field)],
    actions: Vec<Action>,
) -> Result<Entry, ControlError> {
    for name in def.fields.keys() {
        if !fields.iter().any(|(n, _)| n == name) {
            let known: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
            return Err(ControlError::invalid(
                format!("match.{name}"),
                format!(
                    "the table has no field {name:?}; its key is {}",
                    known.join(", ")
                ),
            ));
        }
    }
    let ternary = kind == MatchKind::Ternary;
    let mut key = Vec::new();
    let mut mask = Vec::new();
    for (name, field) in fields {
        let width = field.width();
        match def.fields.get(name) {
            Some(v) => {
                let (k, m) = value_bytes(v, width, ternary)
                    .map_err(|e| ControlError::invalid(format!("match.{name}"), e))?;
                key.extend(k);
                mask.extend(m);
            }
            None if kind == MatchKind::Exact => {
                return Err(ControlError::invalid(
                    format!("match.{name}"),
                    "an exact table needs a value for every field",
                ));
            }
            None => {
                key.extend(std::iter::repeat_n(0, width));
                mask.extend(std::iter::repeat_n(0, width));
            }
        }
    }
    let bits = key.len() * 8;
    match kind {
        MatchKind::Lpm => {
            let p = def.prefix_len.ok_or_else(|| {
                ControlError::invalid("prefix_len", "an LPM entry needs a prefix length in bits")
            })?;
            if usize::from(p) > bits {
                return Err(ControlError::invalid(
                    "prefix_len",
                    format!("{p} bits is longer than the key's {bits}"),
                ));
            }
            Ok(Entry::lpm(key, p, actions))
        }
        _ if def.prefix_len.is_some() => Err(ControlError::invalid(
            "prefix_len",
            "only LPM tables take a prefix length",
        )),
        MatchKind::Exact => Ok(Entry::exact(key, actions)),
        MatchKind::Ternary => Ok(Entry::ternary(key, mask, def.priority, actions)),
    }
}

/// An entry's match, field by field, as the API shows it.
pub fn describe_match(entry: &Entry, fields: &[(String, Field)]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut at = 0;
    for (name, field) in fields {
        let width = field.width();
        let (Some(value), mask) = (
            entry.key.get(at..at + width),
            entry.mask.as_ref().and_then(|m| m.get(at..at + width)),
        ) else {
            break;
        };
        at += width;
        let shown = show_bytes(value, name);
        match mask {
            Some(m) if m.iter().all(|&b| b == 0) => {}
            Some(m) if m.iter().any(|&b| b != 0xff) => {
                out.insert(
                    name.clone(),
                    Value::Masked {
                        value: Box::new(shown),
                        mask: Box::new(Value::Text(hex(m))),
                    },
                );
            }
            _ => {
                out.insert(name.clone(), shown);
            }
        }
    }
    out
}

fn show_bytes(bytes: &[u8], name: &str) -> Value {
    match bytes.len() {
        4 if name.starts_with("ip_") => {
            Value::Text(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).to_string())
        }
        6 if name.starts_with("eth_") => {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(bytes);
            Value::Text(Mac(mac).to_string())
        }
        1..=8 if !name.starts_with("mc_") => {
            Value::Number(bytes.iter().fold(0u64, |n, &b| (n << 8) | u64::from(b)))
        }
        _ => Value::Text(hex(bytes)),
    }
}

/// `0x` and the bytes in hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + 2 * bytes.len());
    s.push_str("0x");
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Bytes from hex digits (an optional `0x` first; spaces and colons ignored).
pub fn unhex(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = text
        .strip_prefix("0x")
        .unwrap_or(text)
        .bytes()
        .filter(|b| !matches!(b, b' ' | b':' | b'\n'))
        .collect();
    if !digits.len().is_multiple_of(2) {
        return Err("an odd number of hex digits".into());
    }
    digits
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("{:?} is not hex", String::from_utf8_lossy(pair)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fill_their_width_or_say_why_not() {
        assert_eq!(
            value_bytes(&Value::Number(11211), 2, false).unwrap().0,
            [0x2b, 0xcb]
        );
        assert!(value_bytes(&Value::Number(70_000), 2, false).is_err());
        assert_eq!(
            value_bytes(&Value::Text("10.0.0.1".into()), 4, false)
                .unwrap()
                .0,
            [10, 0, 0, 1]
        );
        assert_eq!(
            value_bytes(&Value::Text("0x1".into()), 2, false).unwrap().0,
            [0, 1]
        );
        assert!(value_bytes(&Value::Text("0x12345".into()), 2, false).is_err());
        assert!(value_bytes(&Value::Text("10.0.0.1".into()), 6, false).is_err());
        let (v, m) = value_bytes(&Value::Literal { text: "get".into() }, 5, true).unwrap();
        assert_eq!((v, m), (b"get\0\0".to_vec(), vec![0xff, 0xff, 0xff, 0, 0]));
        let masked = Value::Masked {
            value: Box::new(Value::Text("10.0.0.0".into())),
            mask: Box::new(Value::Text("255.255.0.0".into())),
        };
        assert!(value_bytes(&masked, 4, false).is_err());
        assert_eq!(
            value_bytes(&masked, 4, true).unwrap(),
            (vec![10, 0, 0, 0], vec![255, 255, 0, 0])
        );
    }

    #[test]
    fn an_entry_shows_as_it_was_written() {
        let fields: Vec<(String, Field)> = ["ip_dst", "l4_dst", "mc_request"]
            .iter()
            .map(|n| resolve_field(&KeyField::Named(n.to_string())).unwrap())
            .collect();
        let def = EntryDef {
            fields: BTreeMap::from([
                ("ip_dst".to_string(), Value::Text("10.0.0.100".into())),
                (
                    "mc_request".to_string(),
                    Value::Literal {
                        text: "get user:".into(),
                    },
                ),
            ]),
            priority: 7,
            prefix_len: None,
            actions: vec![ActionDef::Drop],
        };
        let entry = build_entry(&def, MatchKind::Ternary, &fields, vec![]).unwrap();
        let shown = describe_match(&entry, &fields);
        assert_eq!(shown["ip_dst"], Value::Text("10.0.0.100".into()));
        assert!(!shown.contains_key("l4_dst"));
        assert!(matches!(shown["mc_request"], Value::Masked { .. }));
        let err = build_entry(&def, MatchKind::Exact, &fields, vec![]).unwrap_err();
        assert_eq!(err.field, "match.l4_dst");
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(&[0, 1, 0xab])).unwrap(), [0, 1, 0xab]);
        assert!(unhex("0xabc").is_err());
        assert!(unhex("zz").is_err());
    }
}
