//! memcached's `version` asked as a probe: over TCP ([`version`], [`flush_then_version`]), in
//! one UDP datagram ([`version_udp`]), or in the binary protocol after SASL for servers that
//! require it ([`version_sasl`]), each within a time limit, each giving the version or why
//! there was none. The controller's health checks, the switch's check of the
//! cache nodes it steers to and the testbed's readiness checks all ask with these. [`stats`]
//! reads a server's counters, which the controller's scaler takes its load from.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use wire::mcudp;
use wire::memcache::cached::push_base64;

/// Why a probe got no `VERSION`.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    #[error("closed the connection")]
    Closed,
    /// Something other than `VERSION ...`, as text.
    #[error("answered {0:?}")]
    Answered(String),
}

/// Longest reply a probe reads.
const MAX_REPLY: usize = 1024;

/// Asks `addr` for `version` over TCP, within `timeout` (connecting included); the `VERSION`
/// line, without its line end.
pub fn version(addr: SocketAddr, timeout: Duration) -> Result<String, ProbeError> {
    ask(addr, timeout, false)
}

/// Empties the server at `addr` (`flush_all`), then asks it `version`, within `timeout`: the
/// probe of a server that is out of a pool, so that it comes back without the items it held
/// while writes to its keys went elsewhere.
pub fn flush_then_version(addr: SocketAddr, timeout: Duration) -> Result<String, ProbeError> {
    ask(addr, timeout, true)
}

fn ask(addr: SocketAddr, timeout: Duration, flush: bool) -> Result<String, ProbeError> {
    let (request, lines, before): (&[u8], usize, &[u8]) = match flush {
        true => (b"flush_all\r\nversion\r\n", 2, b"OK\r\n"),
        false => (b"version\r\n", 1, b""),
    };
    let mut conn = connect_within(addr, timeout)?;
    conn.write_all(request)?;
    let mut reply = Vec::with_capacity(64);
    let mut buf = [0u8; 128];
    let whole =
        |r: &[u8]| r.ends_with(b"\r\n") && r.windows(2).filter(|w| w == b"\r\n").count() >= lines;
    while !whole(&reply) && reply.len() < MAX_REPLY {
        let n = conn.read(&mut buf).map_err(|e| timed_out(e, timeout))?;
        if n == 0 {
            return Err(ProbeError::Closed);
        }
        reply.extend_from_slice(&buf[..n]);
    }
    match reply.strip_prefix(before) {
        Some(line) if line.starts_with(b"VERSION ") => Ok(text(line)),
        _ => Err(ProbeError::Answered(text(&reply))),
    }
}

/// Asks `addr` for `version` in one UDP datagram (with memcached's 8-byte frame header),
/// within `timeout`. The reply is matched by its request id, not by its source: a switch in
/// `l3` mode sends servers' replies from the VIP.
pub fn version_udp(addr: SocketAddr, timeout: Duration) -> Result<String, ProbeError> {
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        SocketAddr::V6(_) => ([0u16; 8], 0).into(),
    };
    let sock = UdpSocket::bind(local)?;
    let started = Instant::now();
    // A request id of its own, so that a late reply to an earlier probe is not taken.
    let id = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos()) as u16)
        ^ (std::process::id() as u16)
        ^ 0x4b56;
    let mut request = [0u8; mcudp::LEN + 9];
    mcudp::Header::single(id).emit(&mut request);
    request[mcudp::LEN..].copy_from_slice(b"version\r\n");
    sock.send_to(&request, addr)?;
    let mut reply = [0u8; 512];
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(ProbeError::NoAnswer(timeout));
        }
        sock.set_read_timeout(Some(left))?;
        let n = match sock.recv_from(&mut reply) {
            Ok((n, _)) => n,
            Err(e) => return Err(timed_out(e, timeout)),
        };
        let Ok((header, body)) = mcudp::Header::parse(&reply[..n]) else {
            continue;
        };
        if header.request_id != id {
            continue;
        }
        return match body.starts_with(b"VERSION ") {
            true => Ok(text(body)),
            false => Err(ProbeError::Answered(text(body))),
        };
    }
}

/// Asks a server that requires SASL (`memcached -S`, binary protocol only) for its version
/// after authenticating as `user` with `password` (PLAIN), emptying it first with `flush`,
/// all within `timeout`; the version.
pub fn version_sasl(
    addr: SocketAddr,
    timeout: Duration,
    (user, password): (&str, &str),
    flush: bool,
) -> Result<String, ProbeError> {
    use wire::memcache::binary::{opcode, write_request, Header, HEADER_LEN};
    let plain = format!("\0{user}\0{password}");
    let mut request = Vec::new();
    write_request(
        opcode::SASL_AUTH,
        b"PLAIN",
        b"",
        plain.as_bytes(),
        1,
        0,
        &mut request,
    );
    let mut ops = vec![opcode::SASL_AUTH];
    if flush {
        write_request(opcode::FLUSH, b"", b"", b"", 2, 0, &mut request);
        ops.push(opcode::FLUSH);
    }
    write_request(opcode::VERSION, b"", b"", b"", 3, 0, &mut request);
    ops.push(opcode::VERSION);
    let mut conn = connect_within(addr, timeout)?;
    conn.write_all(&request)?;
    let mut reply = Vec::with_capacity(128);
    let mut buf = [0u8; 256];
    let mut version = String::new();
    for op in ops {
        // One whole response at the front of `reply`, read as it arrives.
        let (header, len) = loop {
            if let Some(h) = Header::decode(&reply) {
                let len = HEADER_LEN.saturating_add(h.body_len as usize);
                if len > MAX_REPLY {
                    return Err(ProbeError::Answered(format!("a reply of {len} bytes")));
                }
                if reply.len() >= len {
                    break (h, len);
                }
            }
            let n = conn.read(&mut buf).map_err(|e| timed_out(e, timeout))?;
            if n == 0 {
                return Err(ProbeError::Closed);
            }
            reply.extend_from_slice(&buf[..n]);
        };
        if header.magic != wire::memcache::binary::RESPONSE_MAGIC || header.opcode != op {
            return Err(ProbeError::Answered(format!(
                "not the binary reply to opcode {op:#04x}: magic {:#04x}, opcode {:#04x}",
                header.magic, header.opcode
            )));
        }
        // The value after extras and key.
        let value_at = HEADER_LEN + usize::from(header.extras_len) + usize::from(header.key_len);
        let Some(value) = reply.get(value_at..len) else {
            return Err(ProbeError::Answered(
                "a binary reply whose extras and key are longer than its body".into(),
            ));
        };
        let body = text(value);
        if header.vbucket_or_status != 0 {
            let what = if op == opcode::SASL_AUTH {
                "SASL"
            } else {
                "binary request"
            };
            return Err(ProbeError::Answered(format!(
                "{what}: status {:#06x}, {body:?}",
                header.vbucket_or_status
            )));
        }
        if op == opcode::VERSION {
            version = body;
        }
        reply.drain(..len);
    }
    Ok(version)
}

/// Longest `stats` reply read: memcached's has about a hundred lines of at most 60 bytes.
const MAX_STATS: usize = 64 * 1024;

/// Asks `addr` for `stats` over TCP, all within `timeout`: each `STAT name value` line as
/// `(name, value)`, in the order given. A reply that is not `STAT` lines ended by `END`, or
/// is longer than memcached's could be, is refused.
pub fn stats(addr: SocketAddr, timeout: Duration) -> Result<Vec<(String, String)>, ProbeError> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect_within(addr, timeout)?;
    conn.write_all(b"stats\r\n")?;
    let mut reply = Vec::with_capacity(4096);
    let mut buf = [0u8; 4096];
    while !(reply.starts_with(b"END\r\n") || reply.ends_with(b"\r\nEND\r\n")) {
        if reply.len() > MAX_STATS {
            return Err(ProbeError::Answered(format!(
                "a stats reply longer than {MAX_STATS} bytes"
            )));
        }
        read_more(&mut conn, &mut buf, &mut reply, deadline, timeout)?;
    }
    let mut fields = Vec::new();
    for line in reply.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() || line == b"END" {
            continue;
        }
        let mut words = std::str::from_utf8(line)
            .ok()
            .and_then(|l| l.strip_prefix("STAT "))
            .map(|l| l.splitn(2, ' '))
            .ok_or_else(|| ProbeError::Answered(text(line)))?;
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            return Err(ProbeError::Answered(text(line)));
        };
        fields.push((name.to_string(), value.to_string()));
    }
    Ok(fields)
}

/// memcached's longest key.
pub const MAX_KEY: usize = 250;

/// The keys `addr` holds (`lru_crawler metadump all`), at most `limit` of them, all within
/// `timeout`; `None` past `limit`. A key that is empty or longer than memcached's longest is
/// refused (no memcached lists one).
pub fn keys(
    addr: SocketAddr,
    timeout: Duration,
    limit: usize,
) -> Result<Option<Vec<Vec<u8>>>, ProbeError> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect_within(addr, timeout)?;
    conn.write_all(b"lru_crawler metadump all\r\n")?;
    let mut keys = Vec::new();
    let mut pending: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        read_more(&mut conn, &mut buf, &mut pending, deadline, timeout)?;
        let mut used = 0;
        while let Some(end) = pending[used..].iter().position(|&b| b == b'\n') {
            let line = &pending[used..used + end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            used += end + 1;
            if line == b"END" {
                return Ok(Some(keys));
            }
            let Some(key) = line
                .strip_prefix(b"key=")
                .and_then(|l| l.split(|&b| b == b' ').next())
                .and_then(percent_decoded)
                .filter(|k| !k.is_empty() && k.len() <= MAX_KEY)
            else {
                return Err(ProbeError::Answered(text(line)));
            };
            if keys.len() == limit {
                return Ok(None);
            }
            keys.push(key);
        }
        pending.drain(..used);
        // A line: `key=` and the key, up to three bytes a byte, and its other fields.
        if pending.len() > MAX_KEY * 3 + MAX_REPLY {
            return Err(ProbeError::Answered("a metadump line too long".into()));
        }
    }
}

/// `%XX` decoded; `None` if an escape is broken.
fn percent_decoded(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'%' => {
                let hex = std::str::from_utf8(text.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Deletes every key of `keys` at `addr` within `timeout`: meta deletes of the keys in base64
/// (`md <key> b q`, so that any key, spaces and line ends included, is one token), a thousand
/// at a time, each thousand ended by `mn` and its `MN` read back. A delete answers `NF` (not
/// there) or nothing; anything else is an error.
pub fn delete_keys(
    addr: SocketAddr,
    keys: &[Vec<u8>],
    timeout: Duration,
) -> Result<(), ProbeError> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect_within(addr, timeout)?;
    let mut out = Vec::with_capacity(64 * 1024);
    let mut pending: Vec<u8> = Vec::with_capacity(8 * 1024);
    let mut buf = [0u8; 8 * 1024];
    for chunk in keys.chunks(1000) {
        out.clear();
        for k in chunk {
            out.extend_from_slice(b"md ");
            push_base64(&mut out, k);
            out.extend_from_slice(b" b q\r\n");
        }
        out.extend_from_slice(b"mn\r\n");
        conn.write_all(&out)?;
        // The answers to this thousand: `NF` lines, then `MN`.
        'answers: loop {
            while let Some(end) = pending.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = pending.drain(..end + 2).take(end).collect();
                match line.as_slice() {
                    b"MN" => break 'answers,
                    b"NF" | b"HD" => {}
                    other => return Err(ProbeError::Answered(text(other))),
                }
            }
            if pending.len() > MAX_REPLY {
                return Err(ProbeError::Answered(text(&pending[..64])));
            }
            read_more(&mut conn, &mut buf, &mut pending, deadline, timeout)?;
        }
    }
    Ok(())
}

/// Reads what `conn` has next into `pending`, waiting until `deadline` at most (`timeout`
/// names the whole wait in the error).
fn read_more(
    conn: &mut TcpStream,
    buf: &mut [u8],
    pending: &mut Vec<u8>,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ProbeError::NoAnswer(timeout));
    }
    conn.set_read_timeout(Some(left))?;
    let n = conn.read(buf).map_err(|e| timed_out(e, timeout))?;
    if n == 0 {
        return Err(ProbeError::Closed);
    }
    pending.extend_from_slice(&buf[..n]);
    Ok(())
}

/// A connection to `addr` made within `timeout`, its reads and writes bounded by what is left
/// of it.
fn connect_within(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, ProbeError> {
    let started = Instant::now();
    let conn = TcpStream::connect_timeout(&addr, timeout)?;
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    conn.set_read_timeout(Some(left))?;
    conn.set_write_timeout(Some(left))?;
    Ok(conn)
}

fn timed_out(e: std::io::Error, timeout: Duration) -> ProbeError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            ProbeError::NoAnswer(timeout)
        }
        _ => ProbeError::Io(e),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A TCP server on loopback that answers its first connection with `reply` once it has
    /// read `want` line ends.
    fn server(reply: &'static [u8], want: usize) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while got.windows(2).filter(|w| w == b"\r\n").count() < want {
                let n = c.read(&mut buf).unwrap();
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
            }
            c.write_all(reply).unwrap();
        });
        addr
    }

    const T: Duration = Duration::from_secs(2);

    #[test]
    fn keys_are_read_from_a_metadump_decoded_and_bounded() {
        let dump: &'static [u8] =
            b"key=a%25b exp=-1 la=1 cas=1 fetch=no cls=1 size=63\nkey=plain exp=-1 la=1 cas=2 fetch=no cls=1 size=65\nEND\r\n";
        let addr = server(dump, 1);
        assert_eq!(
            keys(addr, T, 10).unwrap(),
            Some(vec![b"a%b".to_vec(), b"plain".to_vec()])
        );
        let addr = server(dump, 1);
        assert_eq!(keys(addr, T, 1).unwrap(), None);
        let addr = server(b"key=a%2 exp=-1\nEND\r\n", 1);
        assert!(matches!(keys(addr, T, 10), Err(ProbeError::Answered(_))));
        let addr = server(b"ERROR\r\n", 1);
        assert!(matches!(keys(addr, T, 10), Err(ProbeError::Answered(_))));
        let addr = server(b"key= exp=-1\nEND\r\n", 1);
        assert!(matches!(keys(addr, T, 10), Err(ProbeError::Answered(_))));
        let long = format!("key={} exp=-1\nEND\r\n", "k".repeat(251));
        let addr = server(long.leak().as_bytes(), 1);
        assert!(matches!(keys(addr, T, 10), Err(ProbeError::Answered(_))));
    }

    #[test]
    fn keys_are_deleted_in_base64_whatever_bytes_they_hold() {
        let mut out = Vec::new();
        for (raw, encoded) in [
            (&b""[..], &b""[..]),
            (b"f", b"Zg=="),
            (b"fo", b"Zm8="),
            (b"foo", b"Zm9v"),
            (b"x\r\nflush_all", b"eA0KZmx1c2hfYWxs"),
        ] {
            out.clear();
            push_base64(&mut out, raw);
            assert_eq!(out, encoded, "{raw:?}");
        }
    }

    #[test]
    fn stats_are_read_as_names_and_values_and_anything_else_is_refused() {
        let addr = server(
            b"STAT pid 7\r\nSTAT cmd_get 12\r\nSTAT version 1.6.18\r\nEND\r\n",
            1,
        );
        let got = stats(addr, T).unwrap();
        assert_eq!(
            got,
            vec![
                ("pid".to_string(), "7".to_string()),
                ("cmd_get".to_string(), "12".to_string()),
                ("version".to_string(), "1.6.18".to_string()),
            ]
        );
        let addr = server(b"ERROR\r\nEND\r\n", 1);
        assert!(matches!(stats(addr, T), Err(ProbeError::Answered(_))));
        let addr = server(b"STAT lonely\r\nEND\r\n", 1);
        assert!(matches!(stats(addr, T), Err(ProbeError::Answered(_))));
        let addr = server(b"STAT a 1\r\n", 1);
        assert!(stats(addr, T).is_err(), "no END: closed or timed out");
    }

    /// A TCP server on loopback that answers its first connection's first bytes with `reply`,
    /// then closes it.
    fn binary_server(reply: Vec<u8>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = [0u8; 256];
            if c.read(&mut buf).unwrap_or(0) > 0 {
                let _ = c.write_all(&reply);
            }
        });
        addr
    }

    fn response(op: u8, status: u16, extras: u8, key: u16, body: &[u8]) -> Vec<u8> {
        let mut out = vec![0x81, op];
        out.extend_from_slice(&key.to_be_bytes());
        out.extend_from_slice(&[extras, 0]);
        out.extend_from_slice(&status.to_be_bytes());
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&[0; 12]);
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn a_sasl_probe_authenticates_then_reads_the_version() {
        use wire::memcache::binary::opcode;
        let login = ("kv", "pw");
        let mut ok = response(opcode::SASL_AUTH, 0, 0, 0, b"Authenticated");
        ok.extend(response(opcode::VERSION, 0, 0, 0, b"1.6.21"));
        assert_eq!(
            version_sasl(binary_server(ok), T, login, false).unwrap(),
            "1.6.21"
        );
        let refused = response(opcode::SASL_AUTH, 0x20, 0, 0, b"Auth failure.");
        let e = version_sasl(binary_server(refused), T, login, false).unwrap_err();
        assert!(
            e.to_string().contains("SASL") && e.to_string().contains("0x0020"),
            "{e}"
        );
        // Lengths that do not add up (extras and key longer than the body): an error, no panic,
        // even after an authentication that took.
        let mut odd = response(opcode::SASL_AUTH, 0, 0, 0, b"Authenticated");
        let mut version = response(opcode::VERSION, 0, 0, 0, b"ab");
        version[2..4].copy_from_slice(&10u16.to_be_bytes());
        version[4] = 10;
        odd.extend(version);
        let e = version_sasl(binary_server(odd), T, login, false).unwrap_err();
        assert!(e.to_string().contains("longer than its body"), "{e}");
        // Text in place of a binary reply.
        let text = b"ERROR\r\nERROR\r\nERROR\r\nERROR\r\nERROR\r\n".to_vec();
        assert!(version_sasl(binary_server(text), T, login, false).is_err());
    }

    #[test]
    fn a_version_line_is_the_answer_and_anything_else_an_error() {
        let ok = version(server(b"VERSION 1.6.21\r\n", 1), T).unwrap();
        assert_eq!(ok, "VERSION 1.6.21");
        let e = version(server(b"ERROR\r\n", 1), T).unwrap_err();
        assert_eq!(e.to_string(), "answered \"ERROR\"");
        let e = version(server(b"", 1), T).unwrap_err();
        assert!(matches!(e, ProbeError::Closed), "{e}");
        let flushed = flush_then_version(server(b"OK\r\nVERSION 1.6.21\r\n", 2), T).unwrap();
        assert_eq!(flushed, "VERSION 1.6.21");
        let e = flush_then_version(server(b"VERSION 1\r\nOK\r\n", 2), T).unwrap_err();
        assert!(matches!(e, ProbeError::Answered(_)), "{e}");
    }

    #[test]
    fn a_silent_server_is_no_answer_within_the_limit() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let started = Instant::now();
        let e = version(l.local_addr().unwrap(), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ProbeError::NoAnswer(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = version_udp(u.local_addr().unwrap(), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ProbeError::NoAnswer(_)), "{e}");
    }

    #[test]
    fn a_udp_reply_is_taken_by_its_request_id_only() {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = u.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let (n, from) = u.recv_from(&mut buf).unwrap();
            let (h, _) = mcudp::Header::parse(&buf[..n]).unwrap();
            // One reply with another id first: not taken.
            let mut stale = [0u8; mcudp::LEN + 13];
            mcudp::Header::single(h.request_id.wrapping_add(1)).emit(&mut stale);
            stale[mcudp::LEN..].copy_from_slice(b"VERSION old\r\n");
            u.send_to(&stale, from).unwrap();
            let mut good = [0u8; mcudp::LEN + 15];
            mcudp::Header::single(h.request_id).emit(&mut good);
            good[mcudp::LEN..].copy_from_slice(b"VERSION 1.6.9\r\n");
            u.send_to(&good, from).unwrap();
        });
        assert_eq!(version_udp(addr, T).unwrap(), "VERSION 1.6.9");
    }
}
