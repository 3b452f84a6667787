//! The key-location header: twelve bytes in front of a UDP payload that say where in the
//! payload a request's key lies, so that kvswitch can route any protocol by key without
//! knowing it.
//!
//! ```text
//!  0       1       2       3       4               8               12
//! +-------+-------+-------+-------+---------------+---------------+----------------
//! |  'k'  |  'v'  |  'l'  |   1   |   key_start   |    key_end    | payload ...
//! +-------+-------+-------+-------+---------------+---------------+----------------
//! ```
//!
//! The preamble is `kvl` and the version, 1. `key_start` and `key_end` are big-endian
//! offsets into the payload that follows the header (not counting the header): the key is
//! `payload[key_start..key_end]`, at least one byte and at most [`MAX_KEY`]. The switch
//! routes a datagram to a VIP port it serves this way by those bytes, with the pool's hash
//! and ring, and removes the header before the datagram reaches the server, so the server
//! sees the application's own payload and needs no change. A datagram whose header is not
//! one of these is dropped and counted, never forwarded.
//!
//! Clients attach the header with [`attach`] (or the `kvswitch-keyloc` crate's
//! `KeyedSocket`); the switch reads it with [`parse`]. Pure: no I/O.

use std::ops::Range;

/// The header's length. Even, so that removing it keeps the payload's 16-bit words aligned
/// for the UDP checksum.
pub const LEN: usize = 12;
/// The first four bytes: `kvl` and the version.
pub const PREAMBLE: [u8; 4] = [b'k', b'v', b'l', 1];
/// The longest key: memcached's, which the switch's hashes are written for.
pub const MAX_KEY: usize = 250;

/// Why a datagram's header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Shorter than the header.
    Short,
    /// Not the preamble (another protocol, or another version).
    Preamble,
    /// The key's offsets are out of order or past the payload's end.
    OutOfRange,
    /// The key is empty.
    EmptyKey,
    /// The key is longer than [`MAX_KEY`].
    KeyTooLong,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Error::Short => "shorter than the 12-byte key-location header",
            Error::Preamble => "no key-location preamble (\"kvl\", version 1)",
            Error::OutOfRange => "the key's offsets are out of order or past the payload",
            Error::EmptyKey => "the key is empty",
            Error::KeyTooLong => "the key is longer than 250 bytes",
        })
    }
}

impl std::error::Error for Error {}

/// A datagram's header, checked against its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<'a> {
    /// The application's payload, after the header.
    pub payload: &'a [u8],
    /// Where the key lies in `payload`.
    pub key: Range<usize>,
}

impl Located<'_> {
    /// The key's bytes (none for a value not made by [`parse`] whose range lies outside).
    pub fn key_bytes(&self) -> &[u8] {
        self.payload.get(self.key.clone()).unwrap_or_default()
    }
}

/// Reads the header at the start of a UDP payload and checks it: the preamble, and a key of
/// 1 to [`MAX_KEY`] bytes inside the payload.
pub fn parse(datagram: &[u8]) -> Result<Located<'_>, Error> {
    let Some((header, payload)) = datagram.split_first_chunk::<LEN>() else {
        return Err(Error::Short);
    };
    if header[..4] != PREAMBLE {
        return Err(Error::Preamble);
    }
    let start = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let end = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    if start > end || end > payload.len() {
        return Err(Error::OutOfRange);
    }
    match end - start {
        0 => Err(Error::EmptyKey),
        n if n > MAX_KEY => Err(Error::KeyTooLong),
        _ => Ok(Located {
            payload,
            key: start..end,
        }),
    }
}

/// The header for a key at `key` in a payload.
pub fn header(key: Range<usize>) -> [u8; LEN] {
    let mut h = [0u8; LEN];
    h[..4].copy_from_slice(&PREAMBLE);
    h[4..8].copy_from_slice(&(key.start as u32).to_be_bytes());
    h[8..].copy_from_slice(&(key.end as u32).to_be_bytes());
    h
}

/// `payload` with the header for its key at `key` in front; an error when the key is empty,
/// too long or not inside the payload (the switch would drop the datagram).
pub fn attach(payload: &[u8], key: Range<usize>) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(LEN + payload.len());
    out.extend_from_slice(&header(key));
    out.extend_from_slice(payload);
    parse(&out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_attached_is_read_back() {
        let d = attach(b"GET user:42 please", 4..11).unwrap();
        assert_eq!(d.len(), LEN + 18);
        let l = parse(&d).unwrap();
        assert_eq!(l.key_bytes(), b"user:42");
        assert_eq!(l.payload, b"GET user:42 please");
    }

    #[test]
    fn bad_headers_are_refused_with_their_reason() {
        let ok = attach(b"abc", 0..3).unwrap();
        assert_eq!(parse(&ok[..LEN - 1]), Err(Error::Short));
        let mut wrong = ok.clone();
        wrong[3] = 2;
        assert_eq!(parse(&wrong), Err(Error::Preamble));
        assert_eq!(attach(b"abc", 2..4), Err(Error::OutOfRange));
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 3..2;
        assert_eq!(attach(b"abc", backwards), Err(Error::OutOfRange));
        assert_eq!(attach(b"abc", 1..1), Err(Error::EmptyKey));
        let long = vec![b'x'; 300];
        assert_eq!(attach(&long, 0..251), Err(Error::KeyTooLong));
        assert!(attach(&long, 50..300).is_ok());
        // Offsets past 32 bits never wrap into range.
        let mut huge = header(0..1).to_vec();
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        huge.push(b'x');
        assert_eq!(parse(&huge), Err(Error::OutOfRange));
    }
}
