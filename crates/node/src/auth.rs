//! The SwitchKV control channel's authentication (between a backend and its cache node): a
//! key the nodes share, read from a file at start; an HMAC-SHA256 over every message, request
//! or reply, with who sent it to whom and where it stands in its sender's session; and a
//! receiver's record of its senders' sessions, which refuses a message older than, or the
//! same as, one it took.
//!
//! A sender's session is an epoch it picks at random when it starts; its messages are
//! numbered from 1 on each of its channels (`stream`: one per connection it keeps, so that a
//! message overtaken on another connection is not taken for a replay). A receiver takes a
//! new epoch from a sender as its restart and refuses the epochs it retired since it
//! started. What this cannot tell: a receiver that starts afresh has retired nothing, so a
//! recording of a sender's earlier session can be played to it until the sender's current
//! session speaks. The MAC binds the two ends' addresses, so a message is not taken from
//! another address or by another receiver; it does not hide anything.
//!
//! Reads the key file; no other I/O, and no clock.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wire::switchkv::{Seal, MAC_LEN};

type HmacSha256 = Hmac<Sha256>;

/// The fewest bytes a key file holds (after trailing white space): 32, as many as the MAC
/// itself (RFC 2104 advises a key no shorter than the hash's output). The testbed writes 32
/// random bytes as 64 hex digits.
pub const MIN_KEY_LEN: usize = 32;
/// Channels a sender numbers its messages on.
pub const STREAMS: usize = 4;
/// A backend's channels: its start (`reset`), its reports, its updates.
pub const STREAM_START: u8 = 0;
pub const STREAM_REPORTS: u8 = 1;
pub const STREAM_WRITES: u8 = 2;
/// A cache node's channel to each of its backends (fetches, renewals).
pub const STREAM_CACHE: u8 = 0;
/// Earlier sessions of one sender a receiver remembers (and refuses).
const RETIRED: usize = 16;
/// What every MAC starts with: the protocol and its version.
const DOMAIN: &[u8] = b"kvswitch switchkv control v1\n";

/// The key the backends and cache nodes share, as HMAC's state after it (what every MAC
/// starts from). Its bytes are not shown by `Debug`.
#[derive(Clone)]
pub struct Key {
    keyed: HmacSha256,
    len: usize,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.len)
    }
}

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the control key file {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the control key file {path} holds {len} bytes; it needs at least {MIN_KEY_LEN} \
         (for instance 32 random bytes written as 64 hex digits)"
    )]
    TooShort { path: PathBuf, len: usize },
}

impl Key {
    /// The key in the file at `path`: its bytes, less trailing white space (a final newline).
    pub fn read(path: &Path) -> Result<Key, KeyError> {
        let bytes = std::fs::read(path).map_err(|source| KeyError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        Key::from_bytes(&bytes).map_err(|len| KeyError::TooShort {
            path: path.to_owned(),
            len,
        })
    }

    /// The key `bytes` (less trailing white space) make; `Err` with their length when they
    /// are too few.
    pub fn from_bytes(bytes: &[u8]) -> Result<Key, usize> {
        let bytes = bytes.trim_ascii_end();
        if bytes.len() < MIN_KEY_LEN {
            return Err(bytes.len());
        }
        // HMAC takes a key of any length: this cannot fail.
        let keyed = HmacSha256::new_from_slice(bytes).map_err(|_| bytes.len())?;
        Ok(Key {
            keyed,
            len: bytes.len(),
        })
    }
}

/// A request, or the reply to one: a reply's MAC can stand for no request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Reply,
}

/// The addresses of a message's sender and receiver, as both see them on their connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ends {
    pub from: IpAddr,
    pub to: IpAddr,
}

impl Ends {
    /// `from` to `to`, an IPv4 address in IPv6 clothing read as the IPv4 one.
    pub fn new(from: IpAddr, to: IpAddr) -> Ends {
        Ends {
            from: from.to_canonical(),
            to: to.to_canonical(),
        }
    }
}

/// The MAC of `message` sent as `kind` between `ends` under `seal`'s port, epoch, stream and
/// sequence (its `mac` is not read).
pub fn mac(key: &Key, kind: Kind, ends: Ends, seal: &Seal, message: &[u8]) -> [u8; MAC_LEN] {
    keyed(key, kind, ends, seal, message)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `seal`'s MAC is that of `message` (compared in constant time).
pub fn verify(key: &Key, kind: Kind, ends: Ends, seal: &Seal, message: &[u8]) -> bool {
    keyed(key, kind, ends, seal, message)
        .verify_slice(&seal.mac)
        .is_ok()
}

fn keyed(key: &Key, kind: Kind, ends: Ends, seal: &Seal, message: &[u8]) -> HmacSha256 {
    let mut m = key.keyed.clone();
    let kind = match kind {
        Kind::Request => "request",
        Kind::Reply => "reply",
    };
    // Each field ends with a byte none of them holds, so no two inputs read alike.
    m.update(DOMAIN);
    m.update(
        format!(
            "{kind} from {} to {} port {} epoch {:016x} stream {} seq {}\n",
            ends.from, ends.to, seal.port, seal.epoch, seal.stream, seal.seq
        )
        .as_bytes(),
    );
    m.update(message);
    m
}

/// A sender's side of its session: the key, its control port, the epoch it picked at start
/// and the next sequence number of each of its channels.
#[derive(Debug)]
pub struct Sender {
    key: Key,
    port: u16,
    epoch: u64,
    next: [AtomicU64; STREAMS],
}

impl Sender {
    /// A session of the node whose control port is `port`, numbered `epoch` (pick it at
    /// random when the node starts).
    pub fn new(key: Key, port: u16, epoch: u64) -> Sender {
        Sender {
            key,
            port,
            epoch,
            next: Default::default(),
        }
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The seal of `message`, the next request on `stream` (below [`STREAMS`]) between `ends`.
    pub fn seal(&self, stream: u8, ends: Ends, message: &[u8]) -> Seal {
        let seq = self.next[usize::from(stream) % STREAMS].fetch_add(1, Ordering::Relaxed) + 1;
        let mut seal = Seal {
            port: self.port,
            epoch: self.epoch,
            stream,
            seq,
            mac: [0; MAC_LEN],
        };
        seal.mac = mac(&self.key, Kind::Request, ends, &seal, message);
        seal
    }

    /// The seal of `reply`, the answer to the request `request` sealed, between `ends` (this
    /// node to the request's sender).
    pub fn seal_reply(&self, request: &Seal, ends: Ends, reply: &[u8]) -> Seal {
        let mut seal = Seal {
            port: self.port,
            mac: [0; MAC_LEN],
            ..*request
        };
        seal.mac = mac(&self.key, Kind::Reply, ends, &seal, reply);
        seal
    }
}

/// Why a control message was refused; each has its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No seal in front of it.
    Unsigned,
    /// A MAC that is not the message's under the key.
    BadMac,
    /// A sequence number not above the last one taken on its channel.
    Replayed,
    /// A session its sender left since (it started again).
    OldSession,
    /// From an address and port that is not a configured peer's, or naming another port than
    /// its seal does.
    UnknownPeer,
    /// About a key the pool places on another backend.
    NotItsKey,
    /// Bytes that are no message, or a seal's fields out of range.
    Malformed,
}

impl Refusal {
    pub const ALL: [Refusal; 7] = [
        Refusal::Unsigned,
        Refusal::BadMac,
        Refusal::Replayed,
        Refusal::OldSession,
        Refusal::UnknownPeer,
        Refusal::NotItsKey,
        Refusal::Malformed,
    ];

    /// The counter's name, as `stats` shows it (`switchkv_refused_<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::BadMac => "bad_mac",
            Refusal::Replayed => "replayed",
            Refusal::OldSession => "old_session",
            Refusal::UnknownPeer => "unknown_peer",
            Refusal::NotItsKey => "not_its_key",
            Refusal::Malformed => "malformed",
        }
    }
}

/// Refused control messages, by reason.
#[derive(Debug, Default)]
pub struct Refusals([AtomicU64; Refusal::ALL.len()]);

impl Refusals {
    pub fn count(&self, why: Refusal) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, why: Refusal) -> u64 {
        self.0[why as usize].load(Ordering::Relaxed)
    }
}

/// One sender's session as its receiver knows it.
#[derive(Debug, Default)]
struct Session {
    epoch: u64,
    /// The last sequence number taken on each channel (0: none).
    last: [u64; STREAMS],
    retired: VecDeque<u64>,
}

/// A receiver's record of its senders' sessions, by sender (its address and control port).
#[derive(Debug, Default)]
pub struct Sessions {
    senders: HashMap<SocketAddr, Session>,
}

impl Sessions {
    /// Takes `seal` (its MAC checked) from `sender`: refused when its session is one the
    /// sender left, or its sequence number is not above the last taken on its channel. A new
    /// epoch is the sender's restart: the one it had is retired.
    pub fn take(&mut self, sender: SocketAddr, seal: &Seal) -> Result<(), Refusal> {
        let stream = usize::from(seal.stream);
        if stream >= STREAMS || seal.seq == 0 {
            return Err(Refusal::Malformed);
        }
        let session = self.senders.entry(sender).or_insert_with(|| Session {
            epoch: seal.epoch,
            ..Session::default()
        });
        if session.epoch != seal.epoch {
            if session.retired.contains(&seal.epoch) {
                return Err(Refusal::OldSession);
            }
            if session.retired.len() == RETIRED {
                session.retired.pop_front();
            }
            session.retired.push_back(session.epoch);
            session.epoch = seal.epoch;
            session.last = [0; STREAMS];
        }
        if seal.seq <= session.last[stream] {
            return Err(Refusal::Replayed);
        }
        session.last[stream] = seal.seq;
        Ok(())
    }
}

/// A control port's gate: the peers it takes messages from (their address and control port),
/// the key their MACs are checked with, their sessions, and what it refused.
#[derive(Debug)]
pub struct Guard {
    /// This node's own session: it seals the replies.
    pub own: Arc<Sender>,
    peers: Vec<SocketAddr>,
    sessions: Mutex<Sessions>,
    pub refused: Arc<Refusals>,
}

impl Guard {
    /// A gate taking messages from `peers` only, sealing replies as `own`, counting refusals
    /// in `refused`.
    pub fn new(own: Arc<Sender>, peers: Vec<SocketAddr>, refused: Arc<Refusals>) -> Guard {
        let peers = peers
            .into_iter()
            .map(|p| SocketAddr::new(p.ip().to_canonical(), p.port()))
            .collect();
        Guard {
            own,
            peers,
            sessions: Mutex::new(Sessions::default()),
            refused,
        }
    }

    /// Checks `message` (its bytes as received), sealed by `seal`, that came from `peer` to
    /// `local`: the sender (its address and control port) if it is taken. A refusal is
    /// counted.
    pub fn check(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        seal: Option<&Seal>,
        message: &[u8],
    ) -> Result<SocketAddr, Refusal> {
        let outcome = self.judge(peer, local, seal, message);
        if let Err(why) = outcome {
            self.refused.count(why);
        }
        outcome
    }

    fn judge(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        seal: Option<&Seal>,
        message: &[u8],
    ) -> Result<SocketAddr, Refusal> {
        let seal = seal.ok_or(Refusal::Unsigned)?;
        let sender = SocketAddr::new(peer.ip().to_canonical(), seal.port);
        if !self.peers.contains(&sender) {
            return Err(Refusal::UnknownPeer);
        }
        let ends = Ends::new(peer.ip(), local.ip());
        if !verify(self.own.key(), Kind::Request, ends, seal, message) {
            return Err(Refusal::BadMac);
        }
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(sender, seal)?;
        Ok(sender)
    }

    /// Counts a refusal made after the message was taken (what it says is refused).
    pub fn count(&self, why: Refusal) {
        self.refused.count(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::switchkv::{parse, parse_seal, write_seal};

    fn key() -> Key {
        Key::from_bytes(b"0123456789abcdef0123456789abcdef\n").unwrap()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn ends() -> Ends {
        Ends::new([10, 0, 0, 3].into(), [10, 0, 0, 9].into())
    }

    #[test]
    fn the_mac_is_hmac_sha256() {
        // RFC 4231, test case 2.
        let mut m = HmacSha256::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&m.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_sealed_message_on_literal_bytes_is_taken_once() {
        let sender = Sender::new(key(), 11311, 0x0123_4567_89ab_cdef);
        let message = b"update k 0 6\r\nforged\r\n";
        let seal = sender.seal(STREAM_WRITES, ends(), message);
        let mut bytes = Vec::new();
        write_seal(&seal, &mut bytes);
        assert!(bytes.starts_with(b"auth 11311 0123456789abcdef 2 1 "));
        bytes.extend_from_slice(message);
        // What the receiver reads: the seal, then the message right behind it.
        let (read, at) = parse_seal(&bytes).unwrap().unwrap();
        let read = read.unwrap();
        let (_, used) = parse(&bytes[at..]).unwrap().unwrap();
        assert_eq!(&bytes[at..at + used], message);
        // The MAC is HMAC-SHA256 under the key of the protocol's name, the direction, both
        // ends, the seal's fields and the message (as Python's `hmac` computes it from
        // those bytes).
        assert_eq!(
            hex(&read.mac),
            "2ed5d5a44fac3caa8cf16fe8c902d9b518e8d1b95f690c3b3e2a84f348e0a21b"
        );
        let mut whole = DOMAIN.to_vec();
        whole.extend_from_slice(
            b"request from 10.0.0.3 to 10.0.0.9 port 11311 epoch 0123456789abcdef stream 2 \
              seq 1\n",
        );
        whole.extend_from_slice(message);
        let mut m = HmacSha256::new_from_slice(b"0123456789abcdef0123456789abcdef").unwrap();
        m.update(&whole);
        assert_eq!(read.mac[..], m.finalize().into_bytes()[..]);
        let refused = Arc::new(Refusals::default());
        let guard = Guard::new(
            Arc::new(Sender::new(key(), 11311, 7)),
            vec!["10.0.0.3:11311".parse().unwrap()],
            refused.clone(),
        );
        let peer: SocketAddr = "10.0.0.3:40000".parse().unwrap();
        let local: SocketAddr = "10.0.0.9:11311".parse().unwrap();
        let taken = guard.check(peer, local, Some(&read), message);
        assert_eq!(taken, Ok("10.0.0.3:11311".parse().unwrap()));
        // The same bytes again: a replay.
        assert_eq!(
            guard.check(peer, local, Some(&read), message),
            Err(Refusal::Replayed)
        );
        assert_eq!(refused.get(Refusal::Replayed), 1);
    }

    #[test]
    fn a_changed_byte_an_unsigned_message_or_a_stranger_is_refused() {
        let sender = Sender::new(key(), 11311, 42);
        let message = b"delete k\r\n";
        let seal = sender.seal(STREAM_WRITES, ends(), message);
        let refused = Arc::new(Refusals::default());
        let guard = Guard::new(
            Arc::new(Sender::new(key(), 11311, 7)),
            vec!["10.0.0.3:11311".parse().unwrap()],
            refused.clone(),
        );
        let peer: SocketAddr = "10.0.0.3:40000".parse().unwrap();
        let local: SocketAddr = "10.0.0.9:11311".parse().unwrap();
        let check = |seal: &Seal, message: &[u8]| guard.check(peer, local, Some(seal), message);
        assert_eq!(check(&seal, b"delete j\r\n"), Err(Refusal::BadMac));
        let mut flipped = seal;
        flipped.mac[5] ^= 1;
        assert_eq!(check(&flipped, message), Err(Refusal::BadMac));
        // Its fields are under the MAC too: another sequence number is another message.
        assert_eq!(
            check(&Seal { seq: 9, ..seal }, message),
            Err(Refusal::BadMac)
        );
        // Another key.
        let other = Key::from_bytes(&[b'x'; 40]).unwrap();
        let forged = Sender::new(other, 11311, 42).seal(STREAM_WRITES, ends(), message);
        assert_eq!(check(&forged, message), Err(Refusal::BadMac));
        // To another receiver, or from another address.
        let elsewhere: SocketAddr = "10.0.0.10:11311".parse().unwrap();
        assert_eq!(
            guard.check(peer, elsewhere, Some(&seal), message),
            Err(Refusal::BadMac)
        );
        let stranger: SocketAddr = "10.0.0.4:40000".parse().unwrap();
        assert_eq!(
            guard.check(stranger, local, Some(&seal), message),
            Err(Refusal::UnknownPeer)
        );
        assert_eq!(
            guard.check(peer, local, None, message),
            Err(Refusal::Unsigned)
        );
        assert_eq!(check(&seal, message), Ok("10.0.0.3:11311".parse().unwrap()));
        assert_eq!(
            Refusal::ALL.map(|r| refused.get(r)),
            [1, 5, 0, 0, 1, 0, 0],
            "unsigned, bad MAC, replayed, old session, unknown peer, not its key, malformed"
        );
    }

    #[test]
    fn a_restart_is_a_new_session_and_old_ones_stay_refused() {
        let mut sessions = Sessions::default();
        let from: SocketAddr = "10.0.0.3:11311".parse().unwrap();
        let seal = |epoch: u64, stream: u8, seq: u64| Seal {
            port: 11311,
            epoch,
            stream,
            seq,
            mac: [0; MAC_LEN],
        };
        assert_eq!(sessions.take(from, &seal(1, 0, 1)), Ok(()));
        // Channels are numbered apart: one overtaking another is no replay.
        assert_eq!(sessions.take(from, &seal(1, 2, 5)), Ok(()));
        assert_eq!(sessions.take(from, &seal(1, 1, 1)), Ok(()));
        assert_eq!(sessions.take(from, &seal(1, 2, 4)), Err(Refusal::Replayed));
        assert_eq!(sessions.take(from, &seal(1, 2, 5)), Err(Refusal::Replayed));
        // The sender started again: its numbers start again, its old session is over.
        assert_eq!(sessions.take(from, &seal(2, 0, 1)), Ok(()));
        assert_eq!(sessions.take(from, &seal(2, 2, 1)), Ok(()));
        assert_eq!(
            sessions.take(from, &seal(1, 2, 6)),
            Err(Refusal::OldSession)
        );
        assert_eq!(sessions.take(from, &seal(2, 0, 1)), Err(Refusal::Replayed));
        // Another sender has its own.
        let other: SocketAddr = "10.0.0.4:11311".parse().unwrap();
        assert_eq!(sessions.take(other, &seal(1, 0, 1)), Ok(()));
        assert_eq!(
            sessions.take(other, &seal(1, 9, 1)),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            sessions.take(other, &seal(1, 0, 0)),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn a_reply_is_bound_to_its_request() {
        let backend = Sender::new(key(), 11311, 5);
        let request = Sender::new(key(), 11311, 9).seal(STREAM_CACHE, ends(), b"fetch k\r\n");
        let back = Ends::new(ends().to, ends().from);
        let reply = backend.seal_reply(&request, back, b"miss\r\n");
        assert_eq!((reply.epoch, reply.seq), (request.epoch, request.seq));
        assert!(verify(&key(), Kind::Reply, back, &reply, b"miss\r\n"));
        // Not a request, not another request's reply.
        assert!(!verify(&key(), Kind::Request, back, &reply, b"miss\r\n"));
        let later = Seal { seq: 2, ..reply };
        assert!(!verify(&key(), Kind::Reply, back, &later, b"miss\r\n"));
    }

    #[test]
    fn a_key_file_must_be_there_and_long_enough() {
        let dir = std::env::temp_dir().join(format!("kvswitch-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing");
        let e = Key::read(&missing).unwrap_err();
        assert!(matches!(e, KeyError::Unreadable { .. }), "{e}");
        assert!(e.to_string().contains("cannot read"), "{e}");
        let short = dir.join("short");
        std::fs::write(&short, "tooshort\n").unwrap();
        let e = Key::read(&short).unwrap_err();
        assert!(
            matches!(e, KeyError::TooShort { len: 8, .. }) && e.to_string().contains("32"),
            "{e}"
        );
        let good = dir.join("good");
        std::fs::write(&good, format!("{}\n", "ab".repeat(32))).unwrap();
        let k = Key::read(&good).unwrap();
        assert_eq!(format!("{k:?}"), "Key(64 bytes)");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
