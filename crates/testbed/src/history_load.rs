//! Concurrent clients that record histories for [`history`]: random `get`, `gets` then
//! `cas`, `set`, `delete` and `incr` on a few hot keys over memcached's text protocol, each
//! operation logged with its start, end and outcome.
//!
//! Over TCP each client keeps one connection, and opens a new one after a timeout or an error
//! (a late reply would otherwise answer the next request). Over UDP each request is one
//! datagram with memcached's 8-byte frame header and a request id of its own; datagrams with
//! another id (late replies) are skipped. A write without an answer is recorded as uncertain.
//!
//! Over Redis (RESP on one connection, as over TCP) `get`, `set` and `delete` are Redis's own
//! commands; `incr` is a script that increments only a key that exists, as memcached's does;
//! `gets` and `cas` are not made (a mix's `gets_cas` weight is taken as `get`'s).
//!
//! Values are decimal numbers unique per write, `client * 10^12 + seq * 10^6`, so that `incr`
//! (by 1 to 9) applies to any of them and its results do not run into another write's values.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use history::{Kind, Op};

use crate::in_netns;

/// Nanoseconds since a common origin: the times of a recorded history. Every client of a run
/// reads the one clock it was given, so their operations can be compared.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Nanoseconds since the origin, at least 1 (0 is when every key is absent).
    pub fn now(&self) -> u64 {
        (self.origin.elapsed().as_nanos() as u64).max(1)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::start()
    }
}

/// How a client reaches the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// One persistent connection.
    Tcp,
    /// One request per datagram, with memcached's frame header.
    Udp,
    /// Redis's protocol on one persistent connection.
    Redis,
}

/// One client: an id unique in the run (it is part of every value the client writes), where it
/// sends, how long it waits for a reply before the operation counts as unanswered, and the
/// network namespace it runs in (`None`: the caller's).
#[derive(Clone, Debug)]
pub struct Client {
    pub id: u32,
    pub transport: Transport,
    pub target: SocketAddr,
    pub timeout: Duration,
    pub netns: Option<String>,
}

/// Relative weights of the operations a client picks.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub get: u32,
    /// A `gets`, then, on a hit, a `cas` with the unique it returned.
    pub gets_cas: u32,
    pub set: u32,
    pub delete: u32,
    pub incr: u32,
}

impl Default for Mix {
    fn default() -> Mix {
        Mix {
            get: 40,
            gets_cas: 15,
            set: 20,
            delete: 10,
            incr: 15,
        }
    }
}

/// What every client does.
#[derive(Clone, Debug)]
pub struct Load {
    /// The hot keys; each operation picks one uniformly.
    pub keys: Vec<String>,
    /// A client stops after this many operations (a `gets` and its `cas` count as two)...
    pub ops_per_client: usize,
    /// ...or once this long has passed since [`run`] began, whichever comes first.
    pub duration: Duration,
    pub mix: Mix,
    /// Seeds every client's choices (mixed with its id).
    pub seed: u64,
}

/// What one client saw.
#[derive(Clone, Debug, Default)]
pub struct ClientStats {
    pub id: u32,
    pub transport: Option<Transport>,
    pub ops: usize,
    /// Operations without a reply in time (or whose connection failed).
    pub timeouts: usize,
    /// `SERVER_ERROR` replies (error replies over Redis).
    pub server_errors: usize,
    /// Connections opened after the first (TCP).
    pub reconnects: usize,
}

/// The recorded history of a run.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    pub ops: Vec<Op>,
    pub clients: Vec<ClientStats>,
    /// Replies that are not one of the answers memcached gives to the request, each with the
    /// operation it answered; the operation itself is recorded as uncertain (or, for a read, as
    /// failed).
    pub bad_replies: Vec<String>,
    pub elapsed: Duration,
}

impl Recorded {
    pub fn timeouts(&self) -> usize {
        self.clients.iter().map(|c| c.timeouts).sum()
    }

    pub fn server_errors(&self) -> usize {
        self.clients.iter().map(|c| c.server_errors).sum()
    }

    /// Operations recorded by clients of `transport`.
    pub fn ops_over(&self, transport: Transport) -> usize {
        self.clients
            .iter()
            .filter(|c| c.transport == Some(transport))
            .map(|c| c.ops)
            .sum()
    }
}

/// The value `client` writes with its `seq`-th write.
pub fn value_of(client: u32, seq: u64) -> u64 {
    u64::from(client) * 1_000_000_000_000 + seq * 1_000_000
}

/// Most writes a client makes, so that its values stay distinct from every other client's.
const MAX_WRITES: u64 = 999_999;

/// Runs every client on a thread of its own (inside its namespace) until each has done
/// `load.ops_per_client` operations or `load.duration` has passed, and returns the merged
/// history, times taken from `clock`. Fails if a client cannot start (no such namespace, no
/// socket), or if `load` has no keys or client ids repeat.
pub fn run(clients: &[Client], load: &Load, clock: Clock) -> anyhow::Result<Recorded> {
    if load.keys.is_empty() {
        bail!("a load needs at least one key");
    }
    let mut ids: Vec<u32> = clients.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != clients.len() {
        bail!("client ids must be distinct");
    }
    let began = Instant::now();
    let deadline = began + load.duration;
    let results: Vec<anyhow::Result<Recorded>> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter()
            .map(|c| {
                scope.spawn(move || match &c.netns {
                    Some(ns) => {
                        in_netns(ns, || run_client(c, load, clock, deadline)).and_then(|r| r)
                    }
                    None => run_client(c, load, clock, deadline),
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked")))
            })
            .collect()
    });
    let mut out = Recorded::default();
    for (client, result) in clients.iter().zip(results) {
        let one = result.with_context(|| format!("client {}", client.id))?;
        out.ops.extend(one.ops);
        out.clients.extend(one.clients);
        out.bad_replies.extend(one.bad_replies);
    }
    out.elapsed = began.elapsed();
    Ok(out)
}

/// xorshift64*: enough randomness for picking operations, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that nearby seeds start far apart; never zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// memcached's `incr` in Redis: the key incremented only if it exists, else nil.
const INCR_EXISTING: &str =
    "if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) \
     else return false end";

/// A reply as the driver reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    Value {
        value: u64,
        cas: Option<u64>,
    },
    Miss,
    Stored,
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Number(u64),
    ServerError,
    /// Anything else, as text.
    Other(String),
}

/// The reply at the front of `buf` to a request on `key`: `None` while incomplete, else the
/// reply and its length.
fn parse_reply(buf: &[u8], key: &str) -> Option<(Reply, usize)> {
    let eol = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = &buf[..eol];
    let text = String::from_utf8_lossy(line);
    let after = eol + 2;
    let simple = |r| Some((r, after));
    if let Some(rest) = text.strip_prefix("VALUE ") {
        let words: Vec<&str> = rest.split(' ').collect();
        let len = words.get(2).and_then(|w| w.parse::<usize>().ok());
        let (Some(len), true) = (len, words.first() == Some(&key)) else {
            return simple(Reply::Other(text.into_owned()));
        };
        let end = after + len + 2 + b"END\r\n".len();
        if buf.len() < end {
            return None;
        }
        let data = &buf[after..after + len];
        if &buf[after + len..end] != b"\r\nEND\r\n" {
            return Some((
                Reply::Other(String::from_utf8_lossy(&buf[..end]).into()),
                end,
            ));
        }
        let value = std::str::from_utf8(data).ok().and_then(|d| d.parse().ok());
        let cas = match words.get(3) {
            Some(c) => match c.parse() {
                Ok(c) => Some(c),
                Err(_) => return Some((Reply::Other(text.into_owned()), end)),
            },
            None => None,
        };
        return Some(match value {
            Some(value) => (Reply::Value { value, cas }, end),
            None => (
                Reply::Other(String::from_utf8_lossy(&buf[..end]).into()),
                end,
            ),
        });
    }
    match &*text {
        "END" => simple(Reply::Miss),
        "STORED" => simple(Reply::Stored),
        "NOT_STORED" => simple(Reply::NotStored),
        "EXISTS" => simple(Reply::Exists),
        "NOT_FOUND" => simple(Reply::NotFound),
        "DELETED" => simple(Reply::Deleted),
        t if t.starts_with("SERVER_ERROR") => simple(Reply::ServerError),
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => match t.parse() {
            Ok(n) => simple(Reply::Number(n)),
            Err(_) => simple(Reply::Other(t.to_string())),
        },
        t => simple(Reply::Other(t.to_string())),
    }
}

/// Why an exchange got no reply.
enum NoReply {
    /// Not sent at all (no connection): the request had no effect.
    Unsent,
    /// Sent, with no (whole) answer in time or a lost connection: it may have had an effect.
    Lost,
}

/// One client's way to the server.
enum Channel {
    Tcp {
        target: SocketAddr,
        conn: Option<TcpStream>,
        buf: Vec<u8>,
        opened: usize,
        /// RESP rather than memcached's text protocol.
        redis: bool,
    },
    Udp {
        target: SocketAddr,
        sock: UdpSocket,
        id: u16,
    },
}

impl Channel {
    fn open(client: &Client) -> anyhow::Result<Channel> {
        Ok(match client.transport {
            Transport::Tcp | Transport::Redis => Channel::Tcp {
                target: client.target,
                conn: None,
                buf: Vec::new(),
                opened: 0,
                redis: client.transport == Transport::Redis,
            },
            Transport::Udp => Channel::Udp {
                target: client.target,
                sock: UdpSocket::bind(("0.0.0.0", 0)).context("binding a UDP socket")?,
                id: 0,
            },
        })
    }

    /// Sends `request` and waits up to `timeout` for the reply to operation `cmd` on `key`.
    fn call(
        &mut self,
        request: &[u8],
        cmd: &str,
        key: &str,
        timeout: Duration,
    ) -> Result<Reply, NoReply> {
        let deadline = Instant::now() + timeout;
        match self {
            Channel::Tcp {
                target,
                conn,
                buf,
                opened,
                redis,
            } => {
                if conn.is_none() {
                    let stream =
                        TcpStream::connect_timeout(target, timeout).map_err(|_| NoReply::Unsent)?;
                    let _ = stream.set_nodelay(true);
                    let _ = stream.set_write_timeout(Some(timeout));
                    *conn = Some(stream);
                    *opened += 1;
                    buf.clear();
                }
                let parse = |buf: &[u8]| match redis {
                    true => parse_resp(buf, cmd),
                    false => parse_reply(buf, key),
                };
                let result = tcp_exchange(
                    conn.as_mut().expect("just opened"),
                    buf,
                    request,
                    parse,
                    deadline,
                );
                if matches!(result, Err(_) | Ok(Reply::Other(_))) {
                    // A late reply, or the rest of one not understood, would answer the next
                    // request: start over.
                    *conn = None;
                }
                result
            }
            Channel::Udp { target, sock, id } => {
                *id = id.wrapping_add(1);
                let want = id.to_be_bytes();
                let mut datagram = vec![want[0], want[1], 0, 0, 0, 1, 0, 0];
                datagram.extend_from_slice(request);
                sock.send_to(&datagram, *target)
                    .map_err(|_| NoReply::Unsent)?;
                let mut packet = [0u8; 2048];
                loop {
                    let left = deadline
                        .checked_duration_since(Instant::now())
                        .ok_or(NoReply::Lost)?;
                    let _ = sock.set_read_timeout(Some(left.max(Duration::from_micros(100))));
                    let n = match sock.recv_from(&mut packet) {
                        Ok((n, _)) => n,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(_) => return Err(NoReply::Lost),
                    };
                    if n < 8 || packet[..2] != want {
                        continue;
                    }
                    // One datagram of one: the replies here are far smaller than a datagram.
                    if packet[2..6] != [0, 0, 0, 1] {
                        return Ok(Reply::Other(format!(
                            "a reply in several datagrams (header {:?})",
                            &packet[..8]
                        )));
                    }
                    let body = &packet[8..n];
                    return Ok(match parse_reply(body, key) {
                        Some((reply, len)) if len == body.len() => reply,
                        _ => Reply::Other(String::from_utf8_lossy(body).into_owned()),
                    });
                }
            }
        }
    }

    fn reconnects(&self) -> usize {
        match self {
            Channel::Tcp { opened, .. } => opened.saturating_sub(1),
            Channel::Udp { .. } => 0,
        }
    }
}

/// The RESP reply at the front of `buf` to operation `cmd`, read as its memcached
/// counterpart: `None` while incomplete, else the reply and its length.
fn parse_resp(buf: &[u8], cmd: &str) -> Option<(Reply, usize)> {
    let len = match wire::resp::ReplyFramer::default().reply_len(buf) {
        Ok(Some(len)) => len,
        Ok(None) => return None,
        // A reply that cannot be framed will not become one.
        Err(_) => {
            let text = String::from_utf8_lossy(buf).into_owned();
            return Some((Reply::Other(text), buf.len()));
        }
    };
    let reply = &buf[..len];
    let text = String::from_utf8_lossy(reply);
    let number = |body: &[u8]| std::str::from_utf8(body).ok()?.parse::<u64>().ok();
    let parsed = match (cmd, reply) {
        (_, r) if r.starts_with(b"-") => Reply::ServerError,
        ("get" | "incr", b"$-1\r\n" | b"_\r\n") => match cmd {
            "get" => Reply::Miss,
            _ => Reply::NotFound,
        },
        ("get", r) if r.starts_with(b"$") => {
            let body = r.splitn(2, |&b| b == b'\n').nth(1).unwrap_or_default();
            match number(body.strip_suffix(b"\r\n").unwrap_or(body)) {
                Some(value) => Reply::Value { value, cas: None },
                None => Reply::Other(text.into_owned()),
            }
        }
        ("set", b"+OK\r\n") => Reply::Stored,
        ("delete", b":1\r\n") => Reply::Deleted,
        ("delete", b":0\r\n") => Reply::NotFound,
        ("incr", r) => match wire::resp::integer(r) {
            Some(n) if n >= 0 => Reply::Number(n as u64),
            _ => Reply::Other(text.into_owned()),
        },
        _ => Reply::Other(text.into_owned()),
    };
    Some((parsed, len))
}

fn tcp_exchange(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    request: &[u8],
    parse: impl Fn(&[u8]) -> Option<(Reply, usize)>,
    deadline: Instant,
) -> Result<Reply, NoReply> {
    conn.write_all(request).map_err(|_| NoReply::Lost)?;
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((reply, len)) = parse(buf) {
            buf.drain(..len);
            if !buf.is_empty() {
                let extra = String::from_utf8_lossy(buf).into_owned();
                return Ok(Reply::Other(format!("{reply:?} followed by {extra:?}")));
            }
            return Ok(reply);
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .ok_or(NoReply::Lost)?;
        let _ = conn.set_read_timeout(Some(left.max(Duration::from_micros(100))));
        match conn.read(&mut chunk) {
            Ok(0) => return Err(NoReply::Lost),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(NoReply::Lost),
        }
    }
}

/// One client's run: its history, its counts and the replies it could not accept.
fn run_client(
    client: &Client,
    load: &Load,
    clock: Clock,
    deadline: Instant,
) -> anyhow::Result<Recorded> {
    let mut s = Session {
        client,
        clock,
        timeout: client.timeout,
        channel: Channel::open(client)?,
        ops: Vec::with_capacity(load.ops_per_client.min(1 << 20)),
        stats: ClientStats {
            id: client.id,
            transport: Some(client.transport),
            ..ClientStats::default()
        },
        bad: Vec::new(),
    };
    let mut rng = Rng::new(load.seed ^ (u64::from(client.id) << 32));
    let mut writes: u64 = 0;
    let mix = load.mix;
    let weights = [mix.get, mix.gets_cas, mix.set, mix.delete, mix.incr].map(u64::from);
    let total: u64 = weights.iter().sum::<u64>().max(1);

    while s.ops.len() < load.ops_per_client && Instant::now() < deadline && writes < MAX_WRITES {
        let key = load.keys[rng.below(load.keys.len() as u64) as usize].as_str();
        let mut pick = rng.below(total);
        let mut choice = 0;
        while choice < weights.len() - 1 && pick >= weights[choice] {
            pick -= weights[choice];
            choice += 1;
        }
        match choice {
            0 => {
                s.get("get", key);
            }
            1 if client.transport == Transport::Redis => {
                s.get("get", key);
            }
            1 => {
                if let Some(unique) = s.get("gets", key) {
                    writes += 1;
                    s.cas(key, unique, value_of(client.id, writes));
                }
            }
            2 => {
                writes += 1;
                s.set(key, value_of(client.id, writes));
            }
            3 => s.delete(key),
            _ => s.incr(key, 1 + rng.below(9)),
        }
    }
    s.stats.ops = s.ops.len();
    s.stats.reconnects = s.channel.reconnects();
    Ok(Recorded {
        ops: s.ops,
        clients: vec![s.stats],
        bad_replies: s.bad,
        elapsed: Duration::ZERO,
    })
}

/// A client at work: its channel and what it has recorded so far.
struct Session<'a> {
    client: &'a Client,
    clock: Clock,
    timeout: Duration,
    channel: Channel,
    ops: Vec<Op>,
    stats: ClientStats,
    bad: Vec<String>,
}

impl Session<'_> {
    /// Sends `request`, records the operation with the kind `judge` makes of the reply, and
    /// returns the reply. No reply makes it `lost` (or `Failed` when nothing was sent); a
    /// `SERVER_ERROR` makes it `lost` too; a reply `judge` refuses (`None`) is kept in `bad`
    /// and makes it `lost`.
    fn exchange(
        &mut self,
        cmd: &'static str,
        key: &str,
        request: &[u8],
        lost: Kind,
        judge: impl FnOnce(&Reply) -> Option<Kind>,
    ) -> Option<Reply> {
        let start = self.clock.now();
        let reply = self.channel.call(request, cmd, key, self.timeout);
        let end = self.clock.now();
        let (kind, reply) = match reply {
            Ok(Reply::ServerError) => {
                self.stats.server_errors += 1;
                (lost, None)
            }
            Ok(reply) => match judge(&reply) {
                Some(kind) => (kind, Some(reply)),
                None => {
                    self.bad.push(format!(
                        "client {} {cmd} {key:?} at {start} ns: {reply:?}",
                        self.client.id
                    ));
                    (lost, None)
                }
            },
            Err(NoReply::Unsent) => {
                self.stats.timeouts += 1;
                (Kind::Failed, None)
            }
            Err(NoReply::Lost) => {
                self.stats.timeouts += 1;
                (lost, None)
            }
        };
        self.ops.push(Op {
            client: self.client.id,
            cmd,
            key: key.to_string(),
            start,
            end,
            kind,
        });
        reply
    }

    /// The request for a command, in the client's protocol: memcached's text, or `redis`'s
    /// words as a RESP multibulk.
    fn request(&self, memcached: String, redis: &[&str]) -> Vec<u8> {
        if self.client.transport == Transport::Redis {
            let mut out = Vec::new();
            wire::resp::encode_command(redis, &mut out);
            out
        } else {
            memcached.into_bytes()
        }
    }

    /// A `get` or `gets`; returns the CAS unique of a `gets` hit.
    fn get(&mut self, cmd: &'static str, key: &str) -> Option<u64> {
        let with_cas = cmd == "gets";
        let request = self.request(format!("{cmd} {key}\r\n"), &["GET", key]);
        let reply = self.exchange(cmd, key, &request, Kind::Failed, |r| match r {
            Reply::Miss => Some(Kind::Read(None)),
            Reply::Value { value, cas } if cas.is_some() == with_cas => {
                Some(Kind::Read(Some(*value)))
            }
            _ => None,
        });
        match reply {
            Some(Reply::Value { cas, .. }) => cas,
            _ => None,
        }
    }

    fn set(&mut self, key: &str, value: u64) {
        let v = value.to_string();
        let request = self.request(
            format!("set {key} 0 0 {}\r\n{v}\r\n", v.len()),
            &["SET", key, &v],
        );
        let wrote = Kind::Write(Some(value));
        self.exchange("set", key, &request, Kind::MaybeWrite(Some(value)), |r| {
            (*r == Reply::Stored).then_some(wrote)
        });
    }

    fn cas(&mut self, key: &str, unique: u64, value: u64) {
        let v = value.to_string();
        let request = format!("cas {key} 0 0 {} {unique}\r\n{v}\r\n", v.len());
        self.exchange(
            "cas",
            key,
            request.as_bytes(),
            Kind::MaybeWrite(Some(value)),
            |r| match r {
                Reply::Stored => Some(Kind::Write(Some(value))),
                Reply::Exists | Reply::NotFound => Some(Kind::Failed),
                _ => None,
            },
        );
    }

    fn delete(&mut self, key: &str) {
        let request = self.request(format!("delete {key}\r\n"), &["DEL", key]);
        self.exchange(
            "delete",
            key,
            &request,
            Kind::MaybeWrite(None),
            |r| match r {
                Reply::Deleted => Some(Kind::Write(None)),
                Reply::NotFound => Some(Kind::Failed),
                _ => None,
            },
        );
    }

    fn incr(&mut self, key: &str, delta: u64) {
        let d = delta.to_string();
        let request = self.request(
            format!("incr {key} {delta}\r\n"),
            &["EVAL", INCR_EXISTING, "1", key, &d],
        );
        self.exchange("incr", key, &request, Kind::MaybeIncr(delta), |r| match r {
            Reply::Number(n) => Some(Kind::Write(Some(*n))),
            Reply::NotFound => Some(Kind::Failed),
            _ => None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_replies_read_as_their_memcached_counterparts() {
        let read = |b: &[u8], cmd| parse_resp(b, cmd).map(|r| r.0);
        assert_eq!(read(b"$-1\r\n", "get"), Some(Reply::Miss));
        assert_eq!(
            read(b"$4\r\n1234\r\n", "get"),
            Some(Reply::Value {
                value: 1234,
                cas: None
            })
        );
        assert_eq!(parse_resp(b"$4\r\n12", "get"), None);
        assert_eq!(read(b"+OK\r\n", "set"), Some(Reply::Stored));
        assert_eq!(read(b":1\r\n", "delete"), Some(Reply::Deleted));
        assert_eq!(read(b":0\r\n", "delete"), Some(Reply::NotFound));
        assert_eq!(read(b":17\r\n", "incr"), Some(Reply::Number(17)));
        assert_eq!(read(b"$-1\r\n", "incr"), Some(Reply::NotFound));
        assert_eq!(read(b"-ERR down\r\n", "get"), Some(Reply::ServerError));
        assert!(matches!(read(b":1\r\n", "get"), Some(Reply::Other(_))));
        assert!(matches!(read(b"?\r\n", "get"), Some(Reply::Other(_))));
    }

    #[test]
    fn replies_are_framed_and_read() {
        let k = "k";
        assert_eq!(parse_reply(b"END\r\n", k), Some((Reply::Miss, 5)));
        assert_eq!(parse_reply(b"EN", k), None);
        let hit = b"VALUE k 0 4 77\r\n1234\r\nEND\r\n";
        assert_eq!(
            parse_reply(hit, k),
            Some((
                Reply::Value {
                    value: 1234,
                    cas: Some(77)
                },
                hit.len()
            ))
        );
        assert_eq!(parse_reply(&hit[..hit.len() - 1], k), None);
        assert!(matches!(
            parse_reply(b"VALUE other 0 4\r\n1234\r\nEND\r\n", k),
            Some((Reply::Other(_), _))
        ));
        assert!(matches!(
            parse_reply(b"VALUE k 0 4\r\nabcd\r\nEND\r\n", k),
            Some((Reply::Other(_), 24))
        ));
        assert_eq!(parse_reply(b"1005\r\n", k), Some((Reply::Number(1005), 6)));
        assert_eq!(
            parse_reply(b"SERVER_ERROR out of memory\r\n", k).map(|r| r.0),
            Some(Reply::ServerError)
        );
        assert_eq!(
            parse_reply(b"ERROR\r\n", k).map(|r| r.0),
            Some(Reply::Other("ERROR".into()))
        );
    }

    #[test]
    fn values_are_distinct_numbers() {
        assert_eq!(value_of(3, 7), 3_000_007_000_000);
        assert_ne!(value_of(1, MAX_WRITES) + 9 * 100_000, value_of(2, 1));
        let mut rng = Rng::new(1);
        let a: Vec<u64> = (0..4).map(|_| rng.below(16)).collect();
        let mut rng = Rng::new(1);
        let b: Vec<u64> = (0..4).map(|_| rng.below(16)).collect();
        assert_eq!(a, b);
    }
}
