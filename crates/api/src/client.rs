//! [`Client`], the small blocking HTTP client every part of kvswitch speaks to a control
//! API with (the switch's, the proxy's, the controller's): one connection per request, the
//! token sent as a bearer, a refusal told apart from a switch out of reach ([`Refused`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::TOKEN_ENV;

/// Where a command finds a switch's control API and its token: `--api` and `--token-file`,
/// the same for every command that speaks to a switch.
#[derive(clap::Args, Clone, Debug)]
pub struct ApiArgs {
    /// The switch's control API (`switch.api` in its configuration).
    #[arg(long, default_value = config::DEFAULT_API, global = true, value_name = "ADDR:PORT")]
    pub api: SocketAddr,
    /// A file whose first line is the API token (changes need it when the switch has one);
    /// KVSWITCH_API_TOKEN works too.
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

impl ApiArgs {
    /// The client these arguments name, its token read.
    pub fn client(&self) -> anyhow::Result<Client> {
        Ok(Client {
            api: self.api,
            token: token(self.token_file.as_deref())?,
        })
    }
}

/// A blocking client of the control API: one connection per request.
#[derive(Clone, Debug)]
pub struct Client {
    pub api: SocketAddr,
    pub token: Option<String>,
}

impl Client {
    fn connect(&self, timeout: Option<Duration>) -> anyhow::Result<TcpStream> {
        let connect = timeout.map_or(Duration::from_secs(5), |t| t.min(Duration::from_secs(5)));
        let conn = TcpStream::connect_timeout(&self.api, connect).map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the control API at {} ({e}); is kvswitch running there?",
                self.api
            )
        })?;
        conn.set_read_timeout(timeout)?;
        conn.set_write_timeout(Some(timeout.unwrap_or(Duration::from_secs(30))))?;
        Ok(conn)
    }

    /// `GET path` of a streaming route: calls `each` with every JSON line as it arrives,
    /// until the stream ends or `each` returns false.
    pub fn stream(&self, path: &str, mut each: impl FnMut(Value) -> bool) -> anyhow::Result<()> {
        let mut stream = self.open(path)?;
        while let Some(doc) = stream.next_line()? {
            if !each(doc) {
                break;
            }
        }
        Ok(())
    }

    /// `GET path` of a streaming route, answered: the stream is open once this returns.
    pub fn open(&self, path: &str) -> anyhow::Result<Stream> {
        let mut conn = self.connect(None)?;
        let mut head = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.api
        );
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        head.push_str("\r\n");
        conn.write_all(head.as_bytes())?;
        let mut reader = BufReader::new(conn);
        let mut status = String::new();
        reader.read_line(&mut status)?;
        let code: u16 = status
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut chunked = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                break;
            }
            chunked |= line
                .to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked");
        }
        if code != 200 {
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            let body = if chunked { dechunk(&rest) } else { rest };
            let doc: Value = serde_json::from_str(body.trim()).unwrap_or(Value::Null);
            let message = doc["error"].as_str().unwrap_or(body.trim()).to_string();
            bail!("GET {path}: {code}: {message}");
        }
        Ok(Stream {
            path: path.to_string(),
            reader,
            chunked,
            pending: Vec::new(),
            ended: false,
        })
    }
}

/// An open stream of JSON lines (see [`Client::open`]).
pub struct Stream {
    path: String,
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// Bytes read past the last whole line.
    pending: Vec<u8>,
    ended: bool,
}

impl Stream {
    /// The next line, waiting for it; `None` once the stream has ended.
    pub fn next_line(&mut self) -> anyhow::Result<Option<Value>> {
        let path = &self.path;
        loop {
            if let Some(at) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                let doc = serde_json::from_slice(&line)
                    .with_context(|| format!("GET {path}: a line that is not JSON"))?;
                return Ok(Some(doc));
            }
            if self.ended {
                return Ok(None);
            }
            let mut piece = Vec::new();
            if self.chunked {
                let mut size = String::new();
                self.reader.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim(), 16)
                    .with_context(|| format!("GET {path}: a bad chunk size {size:?}"))?;
                if n == 0 {
                    self.ended = true;
                    continue;
                }
                piece.resize(n + 2, 0);
                self.reader.read_exact(&mut piece)?;
                piece.truncate(n);
            } else if self.reader.read_until(b'\n', &mut piece)? == 0 {
                self.ended = true;
                continue;
            }
            self.pending.extend_from_slice(&piece);
        }
    }
}

impl Client {
    /// `method path` with an optional JSON body; the reply's body as JSON (or text wrapped in
    /// a JSON string), or an error carrying the API's message.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        self.call_within(method, path, body, Duration::from_secs(30))
    }

    /// [`Client::call`], giving up on the reply after `limit`.
    pub fn call_within(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        limit: Duration,
    ) -> anyhow::Result<Value> {
        let mut conn = self.connect(Some(limit))?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\n",
            self.api,
            body.len()
        );
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        head.push_str("\r\n");
        conn.write_all(head.as_bytes())?;
        conn.write_all(body.as_bytes())?;
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw)
            .with_context(|| format!("reading the reply to {method} {path}"))?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status: u16 = head
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let chunked = head.lines().any(|l| {
            l.to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked")
        });
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_string()
        };
        let doc: Value = match body.trim() {
            "" => Value::Null,
            b => serde_json::from_str(b).unwrap_or_else(|_| Value::String(b.to_string())),
        };
        if !(200..300).contains(&status) {
            let message = doc
                .get("error")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| body.trim().to_string());
            return Err(Refused {
                what: format!("{method} {path}"),
                status,
                message,
            }
            .into());
        }
        Ok(doc)
    }
}

/// A reply of the API other than 2xx: the call reached the API and was answered, so a caller
/// can tell a refusal (4xx) from a switch out of reach (any other error of [`Client::call`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The method and path.
    pub what: String,
    pub status: u16,
    /// The API's `error`, or its body.
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.what, self.status, self.message)
    }
}

impl std::error::Error for Refused {}

/// The body of a chunked reply.
fn dechunk(mut text: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = text.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        text = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// The token from the environment or `file`, if any.
pub fn token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    if let Ok(t) = std::env::var(TOKEN_ENV) {
        if !t.trim().is_empty() {
            return Ok(Some(t.trim().to_string()));
        }
    }
    match file {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("reading the token file {}", f.display()))?;
            Ok(Some(text.lines().next().unwrap_or("").trim().to_string()))
        }
        None => Ok(None),
    }
}

/// Every entry of `table`, page by page.
pub fn entries(client: &Client, table: &str) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let page = client
            .call(
                "GET",
                &format!("/api/v1/tables/{table}/entries{after}"),
                None,
            )
            .with_context(|| format!("listing the switch's {table} entries"))?;
        all.extend(page["entries"].as_array().cloned().unwrap_or_default());
        match page["next"].as_u64() {
            Some(next) => after = format!("?after={next}"),
            None => return Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
