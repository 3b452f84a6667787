//! Differential checks of a memcached-protocol front (a proxy) against memcached itself: the
//! same bytes go on a fresh connection to each, and the replies must match after masking what
//! two memcached processes legitimately differ in (CAS values, times, versions), as must
//! whether each connection stayed open.
//!
//! [`case`] makes a seeded stream of requests, valid and mutated: text, meta or binary;
//! truncated, oversized, wrong lengths, bad numbers and tokens, bad base64, too many or repeated
//! flags, pipelined and quiet. Each case keeps to keys of its own, so cases do not disturb each
//! other and may run at once. [`exchange`] sends a stream and reads what comes back up to an
//! end marker only a reply to the marker carries.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use base64::Engine;

use crate::replies::{normalise_binary, normalise_text, packets};

/// One stream of requests.
#[derive(Debug, Clone)]
pub struct Case {
    pub bytes: Vec<u8>,
    /// Requests the stream was made of (a mutation may have merged or split some).
    pub requests: usize,
    /// The stream starts with a binary request: the connection speaks the binary protocol.
    pub binary: bool,
}

/// What one connection answered to a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The replies, masked and shown (text as text, binary as packets in hex).
    pub reply: String,
    /// The server closed the connection.
    pub closed: bool,
    /// The end marker's reply came: every request before it was answered.
    pub ended: bool,
}

impl Outcome {
    /// Whether `self`, a proxy's outcome, matches `want`, memcached's: the same, except where
    /// memcached's own timing decides. Where memcached was still waiting for bytes when the
    /// exchange ended (a data block or body it swallows), it may hold replies it has already
    /// made; the proxy must be waiting too, and may have sent more of them.
    pub fn matches(&self, want: &Outcome) -> bool {
        if !want.ended && !want.closed {
            return !self.ended && !self.closed && self.reply.starts_with(&want.reply);
        }
        // Where memcached closes, the replies it made but had not yet written are lost, and
        // which those are depends on when it last wrote: the shorter reply must begin the
        // longer.
        if want.closed {
            return self.closed
                && (self.reply.starts_with(&want.reply) || want.reply.starts_with(&self.reply));
        }
        self == want
    }
}

/// The opaque of the binary end marker.
const END_OPAQUE: u32 = 0x0e0d_0e0d;

/// The end marker for a stream: a request whose reply no request of [`case`] can draw.
fn marker(binary: bool) -> Vec<u8> {
    if binary {
        let mut out = vec![0x80, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        out.extend_from_slice(&END_OPAQUE.to_be_bytes());
        out.extend_from_slice(&[0; 8]);
        out
    } else {
        b"mg diff:end Oend\r\n".to_vec()
    }
}

/// The length of the end marker's answer: a bare binary response header, or `EN Oend`.
fn marker_reply_len(binary: bool) -> usize {
    if binary {
        24
    } else {
        b"EN Oend\r\n".len()
    }
}

fn ended(binary: bool, reply: &[u8]) -> bool {
    if binary {
        packets(reply)
            .last()
            .is_some_and(|p| p[1] == 0x0a && p[12..16] == END_OPAQUE.to_be_bytes())
    } else {
        reply.ends_with(b"EN Oend\r\n")
    }
}

/// How long a connection may stay silent before the end marker is sent again (it may have
/// been read as part of a data block still being waited for).
const QUIET: Duration = Duration::from_millis(400);
/// Times the end marker is sent again before the exchange ends without it.
const RESENDS: usize = 3;

/// Sends `case` and its end marker on a new connection to `addr` and reads until the marker's
/// reply, a close, or [`RESENDS`] silences of [`QUIET`].
pub fn exchange(addr: SocketAddr, case: &Case) -> std::io::Result<Outcome> {
    exchange_with(addr, case, QUIET, RESENDS)
}

/// [`exchange`] with another silence before the end marker goes again, and another number of
/// times it may (a fuzzer, whose inputs are mostly incomplete, waits less).
pub fn exchange_with(
    addr: SocketAddr,
    case: &Case,
    quiet: Duration,
    resends_allowed: usize,
) -> std::io::Result<Outcome> {
    let end = marker(case.binary);
    let (reply, closed, resent) = converse(
        addr,
        &case.bytes,
        &end,
        |reply| ended(case.binary, reply),
        quiet,
        resends_allowed,
    )?;
    let mut reply = reply;
    // A marker sent again while the first one's answer was slow (a loaded machine) is
    // answered twice: one answer is the end, on either side.
    let once = marker_reply_len(case.binary);
    for _ in 0..resent {
        if !(reply.len() >= 2 * once
            && ended(case.binary, &reply)
            && ended(case.binary, &reply[..reply.len() - once])
            && reply[reply.len() - 2 * once..reply.len() - once] == reply[reply.len() - once..])
        {
            break;
        }
        reply.truncate(reply.len() - once);
    }
    let ended = ended(case.binary, &reply);
    let shown = if case.binary {
        normalise_binary(&reply)
            .iter()
            .map(|p| p.iter().map(|b| format!("{b:02x}")).collect::<String>() + " ")
            .collect()
    } else {
        normalise_text(&String::from_utf8_lossy(&reply))
    };
    Ok(Outcome {
        reply: shown,
        closed,
        ended,
    })
}

/// Sends `request`, then `end` (a request whose reply only `ended` recognises), on a new
/// connection to `addr`, and reads until `ended` says the reply is whole, the connection
/// closes, or `resends_allowed` silences of `quiet` pass (after each, `end` goes again: it may
/// have been read as part of a request still waiting for bytes). The bytes read, and whether
/// the connection closed.
pub fn converse(
    addr: SocketAddr,
    request: &[u8],
    end: &[u8],
    ended: impl Fn(&[u8]) -> bool,
    quiet: Duration,
    resends_allowed: usize,
) -> std::io::Result<(Vec<u8>, bool, usize)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut bytes = request.to_vec();
    bytes.extend_from_slice(end);
    let mut reply = Vec::new();
    let mut closed = stream.write_all(&bytes).is_err();
    let mut resends = 0;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut last = Instant::now();
    while !closed && !ended(&reply) {
        stream.set_read_timeout(Some(Duration::from_millis(50)))?;
        match stream.read(&mut chunk) {
            Ok(0) => closed = true,
            Ok(n) => {
                reply.extend_from_slice(&chunk[..n]);
                last = Instant::now();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if last.elapsed() < quiet {
                    continue;
                }
                if resends == resends_allowed {
                    break;
                }
                resends += 1;
                last = Instant::now();
                closed = stream.write_all(end).is_err();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // A reset is a close that left bytes unread.
            Err(_) => closed = true,
        }
    }
    Ok((reply, closed, resends))
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Numbers as a mutation may write them: memcached reads some of these in surprising ways
/// (a tab before a number, a length past 32 bits that wraps).
const ODD_NUMBERS: &[&str] = &[
    "-1",
    "+5",
    "\t5",
    "5\tx",
    "4294967297",
    "99999999999999999999",
    "0x10",
    "",
    "1a",
    "-0",
    "2147483647",
];

/// Bytes a mutation writes into a request.
const ODD_BYTES: &[u8] = b" \t\r\n0x-9qb\x80\x00=";

/// Standard base64 with padding, as memcached's meta commands take a key.
fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The stream of case `index` of the run seeded `seed`.
pub fn case(seed: u64, index: u64) -> Case {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0x0100_0000_01b3));
    let keys: Vec<String> = (0..3).map(|k| format!("d{seed:x}.{index}k{k}")).collect();
    let binary = rng.chance(25);
    let count = 1 + rng.below(8);
    let mut bytes = Vec::new();
    for _ in 0..count {
        let mut request = if binary {
            binary_request(&mut rng, &keys)
        } else {
            text_request(&mut rng, &keys)
        };
        if rng.chance(30) {
            mutate(&mut rng, &mut request, binary);
        }
        bytes.extend_from_slice(&request);
    }
    Case {
        bytes,
        requests: count,
        binary,
    }
}

fn value(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0 => 0,
        1 => 200 + rng.below(3000),
        _ => 1 + rng.below(12),
    };
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

fn text_request(rng: &mut Rng, keys: &[String]) -> Vec<u8> {
    let key = rng.pick(keys).clone();
    let noreply = if rng.chance(20) { " noreply" } else { "" };
    let data = value(rng);
    let stored = |cmd: &str, extra: &str| {
        let mut out = format!(
            "{cmd} {key} {} 0 {}{extra}{noreply}\r\n",
            data.len() % 7,
            data.len()
        )
        .into_bytes();
        out.extend_from_slice(&data);
        out.extend_from_slice(b"\r\n");
        out
    };
    match rng.below(16) {
        0 | 1 => {
            let n = 1 + rng.below(3);
            let chosen: Vec<&str> = (0..n).map(|_| rng.pick(keys).as_str()).collect();
            let cmd = rng.pick(&["get", "gets", "gat 100", "gats 0"]);
            format!("{cmd} {}\r\n", chosen.join(" ")).into_bytes()
        }
        2 | 3 => {
            let cmd = *rng.pick(&["set", "add", "replace", "append", "prepend"]);
            stored(cmd, "")
        }
        4 => {
            let unique = *rng.pick(&[" 0", " 99999999999"]);
            stored("cas", unique)
        }
        5 => format!("delete {key}{noreply}\r\n").into_bytes(),
        6 => {
            let cmd = rng.pick(&["incr", "decr"]);
            format!("{cmd} {key} {}{noreply}\r\n", rng.below(20)).into_bytes()
        }
        7 => format!("touch {key} {}{noreply}\r\n", rng.below(1000)).into_bytes(),
        8 | 9 => meta_get(rng, &key),
        10 | 11 => meta_set(rng, &key, &data),
        12 => meta_flags("md", rng, &key, &["q", "I", "T30", "O9", "k", "b", "C0"]),
        13 => meta_flags(
            "ma",
            rng,
            &key,
            &[
                "N0", "J10", "D2", "T0", "MI", "MD", "q", "O7", "v", "t", "c", "b",
            ],
        ),
        14 => rng
            .pick(&[
                &b"mn\r\n"[..],
                b"version\r\n",
                b"verbosity 1\r\n",
                b"bogus x\r\n",
                b"\r\n",
            ])
            .to_vec(),
        _ => {
            // Set then read back, the commonest pipeline.
            let mut out = stored("set", "");
            out.extend_from_slice(format!("get {key}\r\n").as_bytes());
            out
        }
    }
}

/// A meta key token, in base64 when `b` is among the flags.
fn meta_key(key: &str, flags: &[String]) -> String {
    if flags.iter().any(|f| f == "b") {
        b64(key.as_bytes())
    } else {
        key.to_string()
    }
}

fn some_flags(rng: &mut Rng, choices: &[&str]) -> Vec<String> {
    let n = rng.below(choices.len().min(6) + 1);
    (0..n).map(|_| rng.pick(choices).to_string()).collect()
}

fn meta_get(rng: &mut Rng, key: &str) -> Vec<u8> {
    meta_flags(
        "mg",
        rng,
        key,
        &[
            "v", "f", "t", "s", "k", "c", "q", "O123", "T60", "N30", "h", "l", "u", "b", "E1",
        ],
    )
}

fn meta_flags(cmd: &str, rng: &mut Rng, key: &str, choices: &[&str]) -> Vec<u8> {
    let flags = some_flags(rng, choices);
    let mut line = format!("{cmd} {}", meta_key(key, &flags));
    for f in &flags {
        line.push(' ');
        line.push_str(f);
    }
    line.push_str("\r\n");
    line.into_bytes()
}

fn meta_set(rng: &mut Rng, key: &str, data: &[u8]) -> Vec<u8> {
    let flags = some_flags(
        rng,
        &[
            "T0", "F5", "C0", "q", "I", "MS", "ME", "MA", "MX", "b", "O42", "k", "c",
        ],
    );
    let mut line = format!("ms {} {}", meta_key(key, &flags), data.len());
    for f in &flags {
        line.push(' ');
        line.push_str(f);
    }
    line.push_str("\r\n");
    let mut out = line.into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// One of the mutations a careless or hostile client makes.
fn mutate(rng: &mut Rng, request: &mut Vec<u8>, binary: bool) {
    if request.is_empty() {
        return;
    }
    let at = rng.below(request.len());
    match rng.below(9) {
        0 => request[at] = *rng.pick(ODD_BYTES),
        1 => request.insert(at, *rng.pick(ODD_BYTES)),
        2 => {
            request.remove(at);
        }
        3 => request.truncate(at),
        4 if binary => {
            // A header field changed: lengths, opcode, magic.
            let field = *rng.pick(&[0usize, 1, 3, 4, 10, 11]);
            if let Some(b) = request.get_mut(field) {
                *b = rng.next_u64() as u8;
            }
        }
        5 if !binary => {
            // A number (a length, a flag's value) replaced by one memcached reads oddly.
            let text = String::from_utf8_lossy(request).into_owned();
            let mut tokens: Vec<String> = text
                .split("\r\n")
                .next()
                .unwrap_or("")
                .split(' ')
                .map(str::to_string)
                .collect();
            let numeric: Vec<usize> = (0..tokens.len())
                .filter(|&i| {
                    tokens[i]
                        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                        .parse::<u64>()
                        .is_ok()
                })
                .collect();
            if numeric.is_empty() {
                return;
            }
            let i = *rng.pick(&numeric);
            let prefix: String = tokens[i]
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            tokens[i] = format!("{prefix}{}", rng.pick(ODD_NUMBERS));
            let line_len = text.find("\r\n").map_or(request.len(), |n| n);
            let mut out = tokens.join(" ").into_bytes();
            out.extend_from_slice(&request[line_len.min(request.len())..]);
            *request = out;
        }
        6 if !binary => {
            // Thirty flags, or one repeated.
            let line_end = request
                .iter()
                .position(|&b| b == b'\r')
                .unwrap_or(request.len());
            let extra = if rng.chance(50) {
                " T1".repeat(30)
            } else {
                " v v".to_string()
            };
            request.splice(line_end..line_end, extra.bytes());
        }
        7 if !binary => {
            // A key longer than memcached takes.
            let text = String::from_utf8_lossy(request).into_owned();
            if let Some(space) = text.find(' ') {
                let rest = &text[space + 1..];
                let key_len = rest.find([' ', '\r']).unwrap_or(rest.len());
                let long = "k".repeat(251);
                let mut out = text[..space + 1].to_string();
                out.push_str(&long);
                out.push_str(&rest[key_len..]);
                *request = out.into_bytes();
            }
        }
        _ => {
            // Data shorter or longer than announced by a few bytes.
            if rng.chance(50) {
                request.truncate(request.len().saturating_sub(3));
                request.extend_from_slice(b"\r\n");
            } else {
                let end = request.len().saturating_sub(2);
                request.splice(end..end, b"XY".iter().copied());
            }
        }
    }
}

fn binary_request(rng: &mut Rng, keys: &[String]) -> Vec<u8> {
    let key = rng.pick(keys).clone().into_bytes();
    let data = value(rng);
    // (opcode, extras length, has key, has value)
    const OPS: &[(u8, usize, bool, bool)] = &[
        (0x00, 0, true, false),  // GET
        (0x09, 0, true, false),  // GETQ
        (0x0c, 0, true, false),  // GETK
        (0x0d, 0, true, false),  // GETKQ
        (0x01, 8, true, true),   // SET
        (0x11, 8, true, true),   // SETQ
        (0x02, 8, true, true),   // ADD
        (0x03, 8, true, true),   // REPLACE
        (0x0e, 0, true, true),   // APPEND
        (0x0f, 0, true, true),   // PREPEND
        (0x04, 0, true, false),  // DELETE
        (0x14, 0, true, false),  // DELETEQ
        (0x05, 20, true, false), // INCREMENT
        (0x06, 20, true, false), // DECREMENT
        (0x1c, 4, true, false),  // TOUCH
        (0x1d, 4, true, false),  // GAT
        (0x0a, 0, false, false), // NOOP
        (0x0b, 0, false, false), // VERSION
        (0x50, 0, false, true),  // unknown
    ];
    let &(op, extras_len, has_key, has_value) = rng.pick(OPS);
    let mut extras = vec![0u8; extras_len];
    if extras_len == 20 {
        extras[7] = 1 + rng.below(9) as u8;
    }
    let key = if has_key { key } else { Vec::new() };
    let value = if has_value { data } else { Vec::new() };
    let mut out = Vec::with_capacity(24 + extras.len() + key.len() + value.len());
    let opaque = rng.next_u64() as u32;
    wire::memcache::binary::write_request(op, &key, &extras, &value, opaque, 0, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_a_function_of_seed_and_index() {
        for i in 0..200 {
            assert_eq!(case(7, i).bytes, case(7, i).bytes);
        }
        assert_ne!(case(7, 1).bytes, case(8, 1).bytes);
        let binary = (0..200).filter(|&i| case(1, i).binary).count();
        assert!((20..100).contains(&binary), "{binary} binary cases of 200");
    }

    #[test]
    fn base64_as_memcached_reads_it() {
        assert_eq!(b64(b"abc"), "YWJj");
        assert_eq!(b64(b"ab"), "YWI=");
        assert_eq!(b64(b"a"), "YQ==");
    }
}
