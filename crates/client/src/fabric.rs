//! The client of kvswitch's caching fabric (IncBricks' client API, section 4.7):
//! `get`, `set`, `del`, `increment` and `cond_put` of one key, each a request in the fabric's
//! own message format ([`wire::inc`]) sent over UDP to a memcached server's address on
//! [`wire::inc::PORT`]. The ToR next to the client takes it into the fabric; the answer comes
//! back as a message from the same address. Every call blocks until its reply (or the
//! timeout), so it returns only once the fabric has made the operation coherent.
//!
//! ```no_run
//! let mut c = client::fabric::Client::connect("10.78.0.35".parse().unwrap(), std::time::Duration::from_secs(1))?;
//! c.set("visits", b"1")?;
//! assert_eq!(c.increment("visits", 2)?, Some(3));
//! assert!(!c.cond_put("visits", 2)?); // 3 is not smaller than 2
//! # Ok::<(), client::fabric::Error>(())
//! ```
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use wire::inc::{self as msg, Command, Header, Message};
use wire::mcudp;

/// Longest key: memcached's.
pub const MAX_KEY: usize = 250;
/// Largest value a request carries: what fits one datagram with the headers.
pub const MAX_VALUE: usize = 1300;

/// Why a call did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no reply within {0:?} (is a kvswitch fabric between this host and the server?)")]
    Timeout(Duration),
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    #[error("key must be 1 to {MAX_KEY} bytes with no space or control character")]
    BadKey,
    #[error("value of {0} bytes; at most {MAX_VALUE}")]
    ValueTooLarge(usize),
    /// `SERVER_ERROR` or `CLIENT_ERROR` from the fabric or the server, with its text.
    #[error("the fabric or server answered: {0}")]
    Refused(String),
    #[error("an answer the operation does not have: {0:?}")]
    Unexpected(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A connection-less client of one server through the fabric.
#[derive(Debug)]
pub struct Client {
    sock: UdpSocket,
    server: SocketAddr,
    timeout: Duration,
    next_id: u16,
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY || key.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(Error::BadKey);
    }
    Ok(())
}

impl Client {
    /// A client of the memcached server at `server`, waiting up to `timeout` per call.
    pub fn connect(server: Ipv4Addr, timeout: Duration) -> Result<Client> {
        let sock = UdpSocket::bind(("0.0.0.0", 0))?;
        Ok(Client {
            sock,
            server: SocketAddr::from((server, msg::PORT)),
            timeout,
            next_id: 0,
        })
    }

    /// The value of `key`, or `None` when it has none.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        let reply = self.call(Command::Get, key, format!("get {key}\r\n").as_bytes())?;
        if reply == b"END\r\n" {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&reply);
        let head = format!("VALUE {key} ");
        let line_end = reply
            .windows(2)
            .position(|w| w == b"\r\n")
            .filter(|_| text.starts_with(&head))
            .ok_or_else(|| Error::Unexpected(text.to_string()))?;
        let len: usize = text[..line_end]
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| Error::Unexpected(text.to_string()))?;
        let data = reply
            .get(line_end + 2..line_end + 2 + len)
            .ok_or_else(|| Error::Unexpected(text.to_string()))?;
        Ok(Some(data.to_vec()))
    }

    /// Stores `value` under `key`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        let reply = self.call(Command::Set, key, &store("set", key, value)?)?;
        expect(&reply, b"STORED\r\n")
    }

    /// Deletes `key`; false when it had no value.
    pub fn del(&mut self, key: &str) -> Result<bool> {
        check_key(key)?;
        let reply = self.call(Command::Del, key, format!("delete {key}\r\n").as_bytes())?;
        match &reply[..] {
            b"DELETED\r\n" => Ok(true),
            b"NOT_FOUND\r\n" => Ok(false),
            _ => Err(unexpected(&reply)),
        }
    }

    /// Adds `delta` to the number under `key` (as memcached's `incr`: it wraps at 2^64);
    /// the new number, or `None` when the key has no value.
    pub fn increment(&mut self, key: &str, delta: u64) -> Result<Option<u64>> {
        check_key(key)?;
        let reply = self.call(
            Command::Increment,
            key,
            format!("incr {key} {delta}\r\n").as_bytes(),
        )?;
        if reply == b"NOT_FOUND\r\n" {
            return Ok(None);
        }
        std::str::from_utf8(&reply)
            .ok()
            .and_then(|t| t.trim_end().parse().ok())
            .map(Some)
            .ok_or_else(|| unexpected(&reply))
    }

    /// Sets `key` to `value` if the number it holds is smaller, or it has none; true when
    /// it did.
    pub fn cond_put(&mut self, key: &str, value: u64) -> Result<bool> {
        check_key(key)?;
        let reply = self.call(
            Command::CondPut,
            key,
            &store("set", key, value.to_string().as_bytes())?,
        )?;
        match &reply[..] {
            b"STORED\r\n" => Ok(true),
            b"NOT_STORED\r\n" => Ok(false),
            _ => Err(unexpected(&reply)),
        }
    }

    /// Sends one request and waits for the reply to it; the memcached bytes of the reply.
    fn call(&mut self, command: Command, key: &str, request: &[u8]) -> Result<Vec<u8>> {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let mut datagram = vec![0u8; mcudp::LEN];
        mcudp::Header::single(id).emit(&mut datagram);
        datagram.extend_from_slice(request);
        let mut out = Vec::with_capacity(msg::HEADER_LEN + datagram.len());
        Message {
            header: Header {
                request_id: id,
                command,
                key_hash: msg::key_hash(key.as_bytes()),
                flags: 0,
                origin: 0,
                via: 0,
                epoch: 0,
                client: (Ipv4Addr::UNSPECIFIED, 0),
                server: (Ipv4Addr::UNSPECIFIED, 0),
                lease_ms: 0,
            },
            payload: &datagram,
        }
        .emit(&mut out);
        self.sock.send_to(&out, self.server)?;
        let deadline = Instant::now() + self.timeout;
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or(Error::Timeout(self.timeout))?;
            self.sock.set_read_timeout(Some(left))?;
            let (n, from) = match self.sock.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Error::Timeout(self.timeout))
                }
                Err(e) => return Err(e.into()),
            };
            if from != self.server {
                continue;
            }
            let Ok(m) = Message::parse(&buf[..n]) else {
                continue;
            };
            if m.header.command != Command::Reply || m.header.request_id != id {
                continue;
            }
            let Ok((_, body)) = mcudp::Header::parse(m.payload) else {
                continue;
            };
            if body.starts_with(b"SERVER_ERROR") || body.starts_with(b"CLIENT_ERROR") {
                return Err(Error::Refused(
                    String::from_utf8_lossy(body).trim_end().to_string(),
                ));
            }
            return Ok(body.to_vec());
        }
    }
}

fn store(verb: &str, key: &str, value: &[u8]) -> Result<Vec<u8>> {
    if value.len() > MAX_VALUE {
        return Err(Error::ValueTooLarge(value.len()));
    }
    let mut r = format!("{verb} {key} 0 0 {}\r\n", value.len()).into_bytes();
    r.extend_from_slice(value);
    r.extend_from_slice(b"\r\n");
    Ok(r)
}

fn unexpected(reply: &[u8]) -> Error {
    Error::Unexpected(String::from_utf8_lossy(reply).into_owned())
}

fn expect(reply: &[u8], want: &[u8]) -> Result<()> {
    if reply == want {
        Ok(())
    } else {
        Err(unexpected(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_keys_and_values_are_refused_before_anything_is_sent() {
        let mut c = Client::connect(Ipv4Addr::LOCALHOST, Duration::from_millis(10)).unwrap();
        for key in ["", "a b", "tab\tkey", &"k".repeat(251)] {
            assert!(matches!(c.get(key), Err(Error::BadKey)), "{key:?}");
        }
        assert!(matches!(
            c.set("k", &[b'x'; MAX_VALUE + 1]),
            Err(Error::ValueTooLarge(_))
        ));
    }

    #[test]
    fn no_fabric_is_a_timeout_with_a_hint() {
        // Nothing listens for fabric messages on loopback.
        let mut c = Client::connect(Ipv4Addr::LOCALHOST, Duration::from_millis(50)).unwrap();
        let e = c.get("k").unwrap_err();
        assert!(matches!(e, Error::Timeout(_) | Error::Io(_)), "{e}");
    }
}
