//! kvswitch's fast path: an XDP program on the switch's ports (`bpf/fastpath.c`) that routes
//! single-key reads to the VIP by key and switches unicast IPv4 between known stations, and the
//! loader that attaches it and keeps its maps in step with the switch ([`switch::fastpath`]).
//! Whatever the program is not sure of it passes to the user-space switch unchanged, so the
//! switch's outcome is the same with or without it. The loader holds no switching policy.

//!
//! The program and its loader need clang and libbpf to build: they are the `bpf` feature (on by
//! default). Without it the crate keeps only what the switch's status and metrics name (the
//! counters, the reasons, the modes).

#[cfg(feature = "bpf")]
mod loader;
#[cfg(feature = "bpf")]
pub use loader::*;

#[cfg(feature = "bpf")]
pub mod impair;
#[cfg(feature = "bpf")]
pub use impair::Impair;

/// The limits and codes of `bpf/fastpath.h`, generated from it at build time.
pub mod abi {
    include!(concat!(env!("OUT_DIR"), "/abi.rs"));
}

/// What went wrong, with the kernel's or libbpf's reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the XDP program: {0}")]
    Load(String),
    #[error("the XDP program's map {map} has {what} {found}, the loader expects {expected}")]
    Abi {
        map: &'static str,
        what: &'static str,
        found: u32,
        expected: u32,
    },
    #[error("attaching XDP to ifindex {ifindex}: {reason}")]
    Attach { ifindex: u32, reason: String },
    #[error("writing the XDP map {map}: {reason}")]
    Map { map: &'static str, reason: String },
    #[error("the XDP program ran but failed: {0}")]
    TestRun(String),
}

/// How the program is attached to a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In the driver (veth has it): frames never become socket buffers.
    Native,
    /// After the driver, on socket buffers: works on any interface, costs more.
    Generic,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Generic => "generic",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The program's verdict on one frame (its XDP action).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Up to the user-space switch, unchanged.
    Pass,
    /// Back out of the port it came in on.
    Tx,
    /// Out of another port.
    Redirect,
    /// Dropped (a reply past its client's limit; counted).
    Drop,
    /// Anything else (the program never returns it).
    Other(u32),
}

impl Verdict {
    #[cfg(feature = "bpf")]
    fn from_action(action: u32) -> Verdict {
        match action {
            1 => Verdict::Drop,
            2 => Verdict::Pass,
            3 => Verdict::Tx,
            4 => Verdict::Redirect,
            other => Verdict::Other(other),
        }
    }
}

/// One frame through the program with `BPF_PROG_TEST_RUN`: what it decided, the frame as it
/// left, and the switch port it was sent to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestRun {
    pub verdict: Verdict,
    pub frame: Vec<u8>,
    pub out_port: Option<u16>,
}

/// Why the program passes frames up, by counter index (see `fastpath.h`).
pub const PASS_REASONS: [(&str, u32); 15] = [
    ("off", abi::C_PASS_OFF),
    ("not_ipv4", abi::C_PASS_NOT_IPV4),
    ("ip_header", abi::C_PASS_IP_HEADER),
    ("stranger", abi::C_PASS_STRANGER),
    ("to_switch", abi::C_PASS_TO_SWITCH),
    ("request", abi::C_PASS_REQUEST),
    ("checksum", abi::C_PASS_CHECKSUM),
    ("no_server", abi::C_PASS_NO_SERVER),
    ("no_station", abi::C_PASS_NO_STATION),
    ("blocked", abi::C_PASS_BLOCKED),
    ("cache", abi::C_PASS_CACHE),
    ("no_room", abi::C_PASS_NO_ROOM),
    ("pool_change", abi::C_PASS_POOL_CHANGE),
    ("keyed", abi::C_PASS_KEYED),
    ("leg", abi::C_PASS_LEG),
];

/// The program's counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub frames: u64,
    pub routed: u64,
    pub switched: u64,
    pub replies: u64,
    pub passed: u64,
    pub reply_limited: u64,
    /// Reads answered from the kernel cache.
    pub cache_hits: u64,
    /// Requests to a keyed port routed (also in `routed`).
    pub keyed: u64,
    /// Spliced TCP reply segments rewritten for their clients.
    pub tcp_replies: u64,
    /// Spliced clients' segments (a `get`, an acknowledgement) sent on to their legs.
    pub tcp_requests: u64,
    /// Frames passed up, per reason of [`PASS_REASONS`] (in its order).
    pub passed_by: [u64; PASS_REASONS.len()],
}
