//! Differential checks of a Redis front (a proxy) against one redis-server: the same bytes go
//! on a fresh connection to each, and the replies, byte for byte, and whether each connection
//! stayed open must match.
//!
//! [`case`] makes a seeded stream of commands, valid and mutated: multibulk or inline, single-
//! and multi-key commands whose keys spread over servers, wrong arities, unknown commands,
//! pipelines; then bytes changed, lengths made wrong or huge, arrays cut short. Each case keeps
//! to keys of its own (a prefix per case), so cases may run at once. [`exchange`] sends a
//! stream and reads up to an end marker only the marker's reply carries.

use std::net::SocketAddr;
use std::time::Duration;

use crate::differential::{converse, Outcome, Rng};

/// One stream of commands.
#[derive(Debug, Clone)]
pub struct Case {
    pub bytes: Vec<u8>,
}

/// The end marker: `ECHO` of a word no case's command echoes.
const MARKER: &[u8] = b"*2\r\n$4\r\nECHO\r\n$13\r\nresp:diff:end\r\n";
const MARKER_REPLY: &[u8] = b"$13\r\nresp:diff:end\r\n";

/// Silence after which the marker is sent again (it may have been read as part of a command
/// still being waited for), and how many times.
const QUIET: Duration = Duration::from_millis(300);
const RESENDS: usize = 3;

/// Sends `case` and the end marker on a new connection to `addr`, and reads until the marker's
/// reply, a close, or [`RESENDS`] silences of [`QUIET`].
pub fn exchange(addr: SocketAddr, case: &Case) -> std::io::Result<Outcome> {
    let ended = |reply: &[u8]| reply.ends_with(MARKER_REPLY);
    let (mut reply, closed, resent) = converse(addr, &case.bytes, MARKER, ended, QUIET, RESENDS)?;
    // A marker sent again while the first one's answer was slow (a loaded machine) is
    // answered twice: one answer is the end, on either side.
    let once = MARKER_REPLY.len();
    for _ in 0..resent {
        if reply.len() < 2 * once
            || !reply[..reply.len() - once].ends_with(MARKER_REPLY)
            || !ended(&reply)
        {
            break;
        }
        reply.truncate(reply.len() - once);
    }
    Ok(Outcome {
        ended: ended(&reply),
        reply: reply.escape_ascii().to_string(),
        closed,
    })
}

/// What [`compare`] found: each stream whose answers differed, described, and how many the
/// front refused as naming keys on several servers.
#[derive(Debug, Default)]
pub struct Compared {
    pub failures: Vec<String>,
    pub refused: u64,
}

/// Sends the streams `cases` (of `seed`) on `workers` threads, each to the redis-server at
/// `reference` and through `front` (an exchange with the front under test). A front's answer
/// that holds `cross` (its refusal of keys on several servers, which one server serves) is
/// counted, not a difference.
pub fn compare(
    seed: u64,
    cases: std::ops::Range<u64>,
    workers: usize,
    reference: SocketAddr,
    cross: &str,
    front: impl Fn(&Case) -> std::io::Result<Outcome> + Sync,
) -> Compared {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let next = AtomicU64::new(cases.start);
    let found = Mutex::new(Compared::default());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cases.end {
                    return;
                }
                let c = case(seed, i);
                let want = exchange(reference, &c).expect("redis-server answers");
                let got = front(&c).expect("the front answers");
                let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
                if !got.matches(&want) && got.reply.contains(cross) {
                    found.refused += 1;
                } else if !got.matches(&want) {
                    found.failures.push(format!(
                        "case {i} (seed {seed:#x}): {}\n  redis: {want:?}\n  front: {got:?}",
                        c.bytes.escape_ascii()
                    ));
                }
            });
        }
    });
    found.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// The seeded stream number `index`.
pub fn case(seed: u64, index: u64) -> Case {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0x0100_0000_01b3));
    let keys: Vec<Vec<u8>> = (0..6)
        .map(|k| match k {
            // Two keys that share a hash tag, for commands whose keys must be on one server.
            4 | 5 => format!("{{d{index}}}:{k}").into_bytes(),
            _ => format!("d{index}:{k}").into_bytes(),
        })
        .collect();
    let mut bytes = Vec::new();
    for _ in 0..1 + rng.below(8) {
        let args = command(&mut rng, &keys);
        let mut one = if rng.chance(20) {
            inline(&args)
        } else {
            let mut out = Vec::new();
            encode(&args, &mut out);
            out
        };
        if rng.chance(15) {
            mutate(&mut rng, &mut one);
        }
        bytes.extend_from_slice(&one);
    }
    Case { bytes }
}

fn pick<'a>(rng: &mut Rng, keys: &'a [Vec<u8>]) -> &'a [u8] {
    &keys[rng.below(4)]
}

fn value(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(8) {
        0 => 0,
        1 => 100 + rng.below(3000),
        _ => 1 + rng.below(12),
    };
    const BYTES: &[u8] = b"abcxyz 019\r\n\"'";
    (0..len).map(|_| BYTES[rng.below(BYTES.len())]).collect()
}

fn number(rng: &mut Rng) -> Vec<u8> {
    match rng.below(6) {
        0 => b"x".to_vec(),
        1 => b"-7".to_vec(),
        _ => rng.below(1000).to_string().into_bytes(),
    }
}

/// One command, as its words.
fn command(rng: &mut Rng, keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let w = |s: &str| s.as_bytes().to_vec();
    let several = |rng: &mut Rng| -> Vec<Vec<u8>> {
        (0..1 + rng.below(5))
            .map(|_| pick(rng, keys).to_vec())
            .collect()
    };
    let mut args = match rng.below(30) {
        0..=2 => vec![w("SET"), pick(rng, keys).to_vec(), value(rng)],
        3..=5 => vec![w("GET"), pick(rng, keys).to_vec()],
        6 | 7 => {
            let mut a = vec![w("MGET")];
            a.extend(several(rng));
            a
        }
        8 | 9 => {
            let mut a = vec![w("MSET")];
            for key in several(rng) {
                a.push(key);
                a.push(value(rng));
            }
            a
        }
        10 | 11 => {
            let name = ["DEL", "EXISTS", "UNLINK", "TOUCH"][rng.below(4)];
            let mut a = vec![w(name)];
            a.extend(several(rng));
            a
        }
        12 => vec![w("INCR"), pick(rng, keys).to_vec()],
        13 => vec![w("INCRBY"), pick(rng, keys).to_vec(), number(rng)],
        14 => vec![w("APPEND"), pick(rng, keys).to_vec(), value(rng)],
        15 => vec![w("STRLEN"), pick(rng, keys).to_vec()],
        16 => vec![
            w("GETRANGE"),
            pick(rng, keys).to_vec(),
            number(rng),
            number(rng),
        ],
        17 => vec![w("HSET"), pick(rng, keys).to_vec(), w("f"), value(rng)],
        18 => vec![w("HGETALL"), pick(rng, keys).to_vec()],
        19 => vec![w("RPUSH"), pick(rng, keys).to_vec(), value(rng), value(rng)],
        20 => vec![w("LRANGE"), pick(rng, keys).to_vec(), w("0"), w("-1")],
        21 => vec![w("EXPIRE"), pick(rng, keys).to_vec(), w("1000")],
        22 => vec![w("PERSIST"), pick(rng, keys).to_vec()],
        23 => vec![w("TYPE"), pick(rng, keys).to_vec()],
        // Keys that share a hash tag: served on their one server.
        24 => vec![w("SUNIONSTORE"), keys[4].clone(), keys[5].clone()],
        25 => vec![w("RPOPLPUSH"), keys[4].clone(), keys[5].clone()],
        26 => match rng.below(3) {
            0 => vec![w("PING")],
            1 => vec![w("PING"), value(rng)],
            _ => vec![w("ECHO"), value(rng)],
        },
        27 => vec![w("NOSUCHCMD"), value(rng)],
        28 => vec![
            w("EVAL"),
            w("return redis.call('GET', KEYS[1])"),
            w("1"),
            pick(rng, keys).to_vec(),
        ],
        _ => {
            // A wrong number of arguments.
            let name = ["GET", "MGET", "MSET", "DEL", "SET", "ECHO"][rng.below(6)];
            let mut a = vec![w(name)];
            if name == "MSET" {
                a.push(pick(rng, keys).to_vec());
            }
            a
        }
    };
    if rng.chance(20) {
        args[0] = args[0].to_ascii_lowercase();
    }
    args
}

fn encode(args: &[Vec<u8>], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// The words as an inline line, quoted where they need it.
fn inline(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        let plain = !a.is_empty()
            && a.iter()
                .all(|b| b.is_ascii_graphic() && !b"\"'\\".contains(b));
        if plain {
            out.extend_from_slice(a);
            continue;
        }
        out.push(b'"');
        for &b in a {
            match b {
                b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
                b if b.is_ascii_graphic() || b == b' ' => out.push(b),
                b => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            }
        }
        out.push(b'"');
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Damages one command's bytes.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    match rng.below(9) {
        // Cut short.
        0 => bytes.truncate(rng.below(bytes.len().max(1))),
        // A byte changed.
        1 if !bytes.is_empty() => {
            let i = rng.below(bytes.len());
            bytes[i] = b"*$:\r\n 0-9a\"'\0"[rng.below(13)];
        }
        // A bulk length made wrong, huge or negative.
        2 | 3 => {
            if let Some(i) = bytes.iter().position(|&b| b == b'$') {
                let end = bytes[i..]
                    .iter()
                    .position(|&b| b == b'\r')
                    .map_or(bytes.len(), |e| i + e);
                let new: &[u8] =
                    [&b"-1"[..], b"99999999999", b"536870913", b"x", b"0", b"2"][rng.below(6)];
                bytes.splice(i + 1..end, new.iter().copied());
            }
        }
        // The element count made wrong.
        4 => {
            if bytes.first() == Some(&b'*') {
                let end = bytes
                    .iter()
                    .position(|&b| b == b'\r')
                    .unwrap_or(bytes.len());
                let new: &[u8] = [&b"-1"[..], b"0", b"3000000000", b"01", b"9"][rng.below(5)];
                bytes.splice(1..end, new.iter().copied());
            }
        }
        5 => bytes.splice(0..0, b"\r\n".iter().copied()).for_each(drop),
        6 => bytes
            .splice(0..0, b"*1\r\n:1\r\n".iter().copied())
            .for_each(drop),
        7 => bytes
            .splice(0..0, b"GET \"unbalanced\r\n".iter().copied())
            .for_each(drop),
        _ => {
            let i = rng.below(bytes.len() + 1);
            bytes.insert(i, b'\n');
        }
    }
}
