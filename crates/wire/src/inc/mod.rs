//! The fabric's in-network cache message (IncBricks, section 4.1), carried in a UDP datagram
//! to [`PORT`] between the switches of a fabric and its homes.
//!
//! The first 16 bytes are IncBricks' header: request id, magic, command, key hash. kvswitch
//! adds a fixed 24-byte extension (flags, the client's ToR, the key's write epoch at its home,
//! the original client's address — IncBricks' "expansion" — the server the request is for,
//! and the lease left of a root's copy that fills a ToR). The payload is one memcached UDP datagram, its 8-byte frame header included: the
//! client's request, or one datagram of the server's reply. A memcached client's bytes thus
//! cross the fabric unchanged, and the ToR that shrinks a reply gives the client exactly what
//! the server sent.
//!
//! ```text
//!  0      2            8          12         16    17     18  19  20      24       28     30
//!  +------+------------+----------+----------+-----+------+---+---+-------+--------+------+
//!  |req id| magic (6)  | command  | key hash |flags|origin|via|rsv| epoch |clientIP|cport |
//!  +------+------------+----------+----------+-----+------+---+---+-------+--------+------+
//!  30        34     36      40
//!  +---------+------+-------+-------------------------------------------+
//!  |server IP|sport | lease |  memcached datagram (frame header + bytes) |
//!  +---------+------+-------+-------------------------------------------+
//! ```
//!
//! All numbers are big-endian. Pure: [`Message::parse`] never panics and borrows the payload;
//! [`Message::emit`] writes into a caller's buffer.

pub mod classify;

use std::net::Ipv4Addr;

use crate::Error;

/// The UDP port fabric messages travel to and from.
pub const PORT: u16 = 11311;
/// Marks a datagram as a fabric message.
pub const MAGIC: [u8; 6] = *b"KVSINC";
/// Length of the header (IncBricks' 16 bytes and kvswitch's extension).
pub const HEADER_LEN: usize = 40;

/// The flag bits of [`Header::flags`].
pub mod flags {
    /// The header carries the original client's address (set by the client's ToR).
    pub const EXPANDED: u8 = 1;
    /// The message is off its designated path (a designated switch or link failed): no switch
    /// caches what it carries.
    pub const DETOUR: u8 = 2;
    /// A reply whose value the designated switches on its way may cache, at `epoch`.
    pub const FILL: u8 = 4;
    /// The client speaks this format itself (the `kvswitch inc` library) and gets its reply
    /// as a message; without it the client's ToR answers in memcached's own bytes.
    pub const NATIVE: u8 = 8;
    /// A reply that only fills (a key's value as its home knows it after a conditional put
    /// that changed nothing): the client's ToR caches it and sends nothing on.
    pub const FILL_ONLY: u8 = 16;
    /// [`Header::via`](super::Header::via) names a switch.
    pub const VIA: u8 = 32;
    /// On an INVALIDATE_ACK from a ToR to a home node of its rack: the switch `via` is
    /// counted out (the registration table failed it a lease ago), and every write that
    /// waits for its acknowledgement goes on.
    pub const FAILED: u8 = 64;
    /// On an INCREMENT to a home node: a designated switch on the way computed the new value
    /// on its copy filled at `epoch`, and keeps it if the home's result agrees and nothing
    /// changed the key since (the home then marks its reply a fill).
    pub const COMPUTED: u8 = 128;
}

/// What a message asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// A read of one key.
    Get,
    /// A write of one key's value (memcached's set, add, replace, append, prepend, cas,
    /// touch).
    Set,
    /// A delete of one key.
    Del,
    /// From a home to a sharer: drop the key (at `epoch`) and acknowledge.
    Invalidate,
    /// From a sharer back to the home.
    InvalidateAck,
    /// Add to a key's number (memcached's incr and decr).
    Increment,
    /// Set a key to a number if its value is smaller or unset.
    CondPut,
    /// The answer to any of Get, Set, Del, Increment, CondPut: one datagram of the server's
    /// reply.
    Reply,
    /// Between neighbouring switches: the link and the switch behind it are up.
    Hello,
}

impl Command {
    const ALL: [Command; 9] = [
        Command::Get,
        Command::Set,
        Command::Del,
        Command::Invalidate,
        Command::InvalidateAck,
        Command::Increment,
        Command::CondPut,
        Command::Reply,
        Command::Hello,
    ];

    /// The number on the wire.
    pub const fn code(self) -> u32 {
        match self {
            Command::Get => 1,
            Command::Set => 2,
            Command::Del => 3,
            Command::Invalidate => 4,
            Command::InvalidateAck => 5,
            Command::Increment => 6,
            Command::CondPut => 7,
            Command::Reply => 8,
            Command::Hello => 9,
        }
    }

    pub fn from_code(code: u32) -> Option<Command> {
        Command::ALL.into_iter().find(|c| c.code() == code)
    }

    /// Whether the command changes a key (and so is ordered by the key's home).
    pub const fn is_write(self) -> bool {
        matches!(
            self,
            Command::Set | Command::Del | Command::Increment | Command::CondPut
        )
    }

    pub const fn name(self) -> &'static str {
        match self {
            Command::Get => "get",
            Command::Set => "set",
            Command::Del => "del",
            Command::Invalidate => "invalidate",
            Command::InvalidateAck => "invalidate_ack",
            Command::Increment => "increment",
            Command::CondPut => "cond_put",
            Command::Reply => "reply",
            Command::Hello => "hello",
        }
    }
}

/// The fixed part of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Chosen by whoever sent the request; replies and acknowledgements echo it.
    pub request_id: u16,
    pub command: Command,
    /// [`key_hash`] of the key; 0 for messages about no key (Hello).
    pub key_hash: u32,
    /// [`flags`] bits.
    pub flags: u8,
    /// The switch id of the client's ToR, where replies and acknowledgements return.
    pub origin: u8,
    /// With [`flags::VIA`], a switch the message concerns besides its origin, between a ToR
    /// and a home node of its rack: in a request the ToR passes on, the designated root its
    /// reply goes by (which may cache it); in an invalidation, the sharer it is for; in an
    /// acknowledgement, the sharer that sent it. 0 otherwise.
    pub via: u8,
    /// The key's write epoch at its home: in a reply, the epoch a fill is valid for; in an
    /// invalidation, the epoch of the write that caused it.
    pub epoch: u32,
    /// The original client's address and port (with [`flags::EXPANDED`]).
    pub client: (Ipv4Addr, u16),
    /// The memcached server the request is for.
    pub server: (Ipv4Addr, u16),
    /// In a fill made from a cached copy (a root's or the home's), the milliseconds left of
    /// that copy's lease: every switch it fills keeps the value no longer. 0 otherwise.
    pub lease_ms: u32,
}

/// One message: its header and the memcached datagram it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub header: Header,
    /// A memcached UDP datagram, frame header included (empty for Hello and the
    /// coherence messages).
    pub payload: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn ip(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

/// Whether a UDP payload starts like a fabric message (its magic at its place).
pub fn is_fabric(payload: &[u8]) -> bool {
    payload.get(2..8) == Some(&MAGIC[..])
}

impl<'a> Message<'a> {
    /// Reads a message from a UDP payload. `Truncated` when shorter than the header,
    /// `Malformed` when the magic or the command is not kvswitch's, or a reserved byte is not
    /// zero (every flag bit is defined).
    pub fn parse(buf: &'a [u8]) -> Result<Message<'a>, Error> {
        if buf.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if !is_fabric(buf) {
            return Err(Error::Malformed);
        }
        let command = Command::from_code(be32(buf, 8)).ok_or(Error::Malformed)?;
        let flags = buf[16];
        if buf[19] != 0 {
            return Err(Error::Malformed);
        }
        Ok(Message {
            header: Header {
                request_id: be16(buf, 0),
                command,
                key_hash: be32(buf, 12),
                flags,
                origin: buf[17],
                via: buf[18],
                epoch: be32(buf, 20),
                client: (ip(buf, 24), be16(buf, 28)),
                server: (ip(buf, 30), be16(buf, 34)),
                lease_ms: be32(buf, 36),
            },
            payload: &buf[HEADER_LEN..],
        })
    }

    /// The message's length on the wire.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the message to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        self.header.emit(out);
        out.extend_from_slice(self.payload);
    }
}

impl Header {
    /// Appends the header to `out`; the payload follows it.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.request_id.to_be_bytes());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.command.code().to_be_bytes());
        out.extend_from_slice(&self.key_hash.to_be_bytes());
        out.push(self.flags);
        out.push(self.origin);
        out.push(self.via);
        out.push(0);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.client.0.octets());
        out.extend_from_slice(&self.client.1.to_be_bytes());
        out.extend_from_slice(&self.server.0.octets());
        out.extend_from_slice(&self.server.1.to_be_bytes());
        out.extend_from_slice(&self.lease_ms.to_be_bytes());
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// The key hash of the header and of the registration table: 32-bit FNV-1a.
pub fn key_hash(key: &[u8]) -> u32 {
    crate::fnv::fnv1a(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            request_id: 0xbeef,
            command: Command::Get,
            key_hash: key_hash(b"foo"),
            flags: flags::EXPANDED | flags::FILL | flags::VIA,
            origin: 3,
            via: 5,
            epoch: 0x0102_0304,
            client: (Ipv4Addr::new(10, 1, 0, 2), 40000),
            server: (Ipv4Addr::new(10, 2, 0, 9), 11211),
            lease_ms: 0,
        }
    }

    #[test]
    fn a_message_reads_back_as_written() {
        let payload = b"\x00\x01\x00\x00\x00\x01\x00\x00get foo\r\n";
        for command in Command::ALL {
            let m = Message {
                header: Header {
                    command,
                    ..header()
                },
                payload,
            };
            let mut out = Vec::new();
            m.emit(&mut out);
            assert_eq!(out.len(), m.len());
            assert_eq!(&out[2..8], b"KVSINC");
            assert_eq!(Message::parse(&out), Ok(m));
        }
    }

    #[test]
    fn the_header_is_incbricks_sixteen_bytes_then_the_extension() {
        let mut out = Vec::new();
        header().emit(&mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(&out[0..2], &[0xbe, 0xef]);
        assert_eq!(&out[8..12], &[0, 0, 0, 1]);
        assert_eq!(&out[12..16], &key_hash(b"foo").to_be_bytes());
        assert_eq!(&out[24..28], &[10, 1, 0, 2]);
    }

    #[test]
    fn foreign_or_short_datagrams_are_refused() {
        let mut out = Vec::new();
        header().emit(&mut out);
        for n in 0..HEADER_LEN {
            assert!(Message::parse(&out[..n]).is_err(), "{n}");
        }
        let mut bad = out.clone();
        bad[3] ^= 1;
        assert_eq!(Message::parse(&bad), Err(Error::Malformed));
        let mut bad = out.clone();
        bad[11] = 99;
        assert_eq!(Message::parse(&bad), Err(Error::Malformed));
        let mut bad = out.clone();
        bad[19] = 1;
        assert_eq!(
            Message::parse(&bad),
            Err(Error::Malformed),
            "the reserved byte"
        );
        // The lease a root's fill carries reads back.
        let mut leased = out.clone();
        leased[36..40].copy_from_slice(&1500u32.to_be_bytes());
        assert_eq!(Message::parse(&leased).unwrap().header.lease_ms, 1500);
        assert!(!is_fabric(b"\x00\x01\x00\x00\x00\x01\x00\x00get foo\r\n"));
    }

    #[test]
    fn any_bytes_parse_or_fail_without_panicking() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for len in 0..200 {
            let mut buf: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            if buf.len() >= 8 {
                buf[2..8].copy_from_slice(&MAGIC);
            }
            let _ = Message::parse(&buf);
        }
    }

    #[test]
    fn the_key_hash_is_fnv1a_32() {
        assert_eq!(key_hash(b""), 0x811c_9dc5);
        assert_eq!(key_hash(b"a"), 0xe40c_292c);
    }
}
