//! The one error type of the wire layer: why a frame could not be read.
//!
//! Each variant is a distinct drop reason an operator can count; none carries data or allocates.

use core::fmt;

/// Why a buffer could not be read as the requested format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before the header, or before a length field says it should.
    Truncated,
    /// A field holds a value the format forbids (a length smaller than its header, a bad version).
    Malformed,
    /// The frame is well formed but uses a variant kvswitch does not handle (non-IPv4 ARP,
    /// IP fragments).
    Unsupported,
    /// An IPv4 header or UDP checksum does not verify.
    BadChecksum,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Error::Truncated => "truncated frame",
            Error::Malformed => "malformed frame",
            Error::Unsupported => "unsupported frame",
            Error::BadChecksum => "bad checksum",
        };
        f.write_str(s)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_reason() {
        assert_eq!(Error::Truncated.to_string(), "truncated frame");
        assert_eq!(Error::Malformed.to_string(), "malformed frame");
        assert_eq!(Error::Unsupported.to_string(), "unsupported frame");
        assert_eq!(Error::BadChecksum.to_string(), "bad checksum");
    }
}
