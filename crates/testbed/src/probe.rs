//! Readiness probes: an HTTP request to kvswitch's API (on `ureq`) and a memcached `version`
//! exchange, both with short timeouts so a dead daemon costs milliseconds, not minutes; and a
//! memcached's `stats`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// `GET path`; returns the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    http(addr, "GET", path, None, None)
}

/// `method path`, with the API token as a bearer token and a JSON body when given (declared
/// JSON for any method but GET and HEAD, as kvswitch's APIs want a change); returns the
/// status code, whatever it is, and the body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let body = body.unwrap_or_default();
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header(ureq::http::header::CONNECTION, "close");
    if let Some(token) = token {
        request = request.header(ureq::http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    // kvswitch's APIs take a change only as JSON (a type a web page of another origin cannot
    // send without asking first), even a change without a body.
    if !body.is_empty() || !matches!(method, "GET" | "HEAD") {
        request = request.header(ureq::http::header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(body.as_bytes())
        .with_context(|| format!("{method} {path} to {addr}: not a request to send"))?;
    let agent = ureq::Agent::config_builder()
        // Straight to the address: never through a proxy from the environment.
        .proxy(None)
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_per_read(Some(IO_TIMEOUT))
        .timeout_per_write(Some(IO_TIMEOUT))
        .build()
        .new_agent();
    let reply = agent.run(request).map_err(|e| match e {
        ureq::Error::Timeout(ureq::Timeout::Connect) | ureq::Error::ConnectionFailed => {
            anyhow!("connecting to {addr}: {e}")
        }
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            anyhow!("connecting to {addr}: {io}")
        }
        e => anyhow!("{method} {path} to {addr}: {e}"),
    })?;
    let code = reply.status().as_u16();
    let mut raw = Vec::new();
    reply
        .into_body()
        .into_reader()
        .read_to_end(&mut raw)
        .with_context(|| format!("reading HTTP response from {addr}"))?;
    Ok((code, String::from_utf8_lossy(&raw).into_owned()))
}

/// How long reading a memcached's `stats` may take to connect, and then to read.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// The `stats` of a memcached (or a `kvswitch node`) at `addr`, over TCP: each `STAT name
/// value` line's value, by name.
pub fn memcached_stats(addr: SocketAddr) -> anyhow::Result<BTreeMap<String, String>> {
    let mut s = TcpStream::connect_timeout(&addr, STATS_TIMEOUT)
        .with_context(|| format!("asking {addr} for its stats"))?;
    s.set_read_timeout(Some(STATS_TIMEOUT))?;
    s.write_all(b"stats\r\n")?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 8192];
    while !reply.ends_with(b"END\r\n") {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("{addr} closed the connection before the end of its stats");
        }
        reply.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&reply)
        .lines()
        .filter_map(|l| l.strip_prefix("STAT ")?.split_once(' '))
        .map(|(name, value)| (name.to_string(), value.trim().to_string()))
        .collect())
}

/// One counter of [`memcached_stats`]' answer from `addr`, as a number.
pub fn stat_u64(
    stats: &BTreeMap<String, String>,
    name: &str,
    addr: SocketAddr,
) -> anyhow::Result<u64> {
    stats
        .get(name)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {name} in the stats of {addr}"))
}

/// Sends `version\r\n` to a memcached (or nutcracker) at `addr` and returns the reply line.
pub fn memcached_version(addr: SocketAddr) -> anyhow::Result<String> {
    client::memcached::version(addr, IO_TIMEOUT)
        .with_context(|| format!("asking {addr} for `version`"))
}

/// Sends `PING` to a redis-server at `addr` and checks it says `+PONG`.
pub fn redis_ping(addr: SocketAddr) -> anyhow::Result<()> {
    let ping = || -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.write_all(b"PING\r\n")?;
        let mut reply = [0u8; 64];
        let n = s.read(&mut reply)?;
        Ok(reply[..n].to_vec())
    };
    let reply = ping().with_context(|| format!("asking {addr} for `PING`"))?;
    if reply != b"+PONG\r\n" {
        bail!(
            "{addr} answered PING with {:?}",
            String::from_utf8_lossy(&reply)
        );
    }
    Ok(())
}

/// Sends `version\r\n` in one memcached UDP datagram to `addr` and returns the reply line. A
/// memcached that listens on TCP may not have bound its UDP port yet: it binds TCP first.
pub fn memcached_udp_version(addr: SocketAddr) -> anyhow::Result<String> {
    // A datagram lost, or a port not yet bound, costs one short wait: the caller retries.
    client::memcached::version_udp(addr, CONNECT_TIMEOUT)
        .with_context(|| format!("asking {addr} for `version` over UDP"))
}

/// Retries `probe` every 50 ms until it succeeds, `give_up` says stop, or `limit` passes; the
/// error is the last probe error.
pub fn wait_for<T>(
    limit: Duration,
    mut give_up: impl FnMut() -> Option<String>,
    mut probe: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        let err = match probe() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(why) = give_up() {
            return Err(err.context(why));
        }
        if Instant::now() >= deadline {
            return Err(err.context(anyhow!("not ready after {limit:?}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
