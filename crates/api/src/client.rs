//! [`Client`], the blocking client every part of kvswitch speaks to a control API with (the
//! switch's, the proxy's, the controller's), on `ureq`: one connection per request, the token
//! sent as a bearer, a refusal told apart from a switch out of reach ([`Refused`]).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use switch::control::{ControlError, ErrorKind};
use ureq::http;

use crate::TOKEN_ENV;

/// The longest a connection may take to open: a switch that is up answers at once.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// How long a call waits on the reply unless told otherwise, and how long a write may stall
/// on a stream, which waits on its reply for as long as it is open.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// Where a command finds a switch's control API and its token: `--api` and `--token-file`,
/// and for an API that speaks HTTPS, `--api-ca` (with `--api-cert` and `--api-key` when it
/// asks for a client certificate); the same for every command that speaks to a switch.
#[derive(clap::Args, Clone, Debug)]
pub struct ApiArgs {
    /// The switch's control API (`switch.api` in its configuration).
    #[arg(long, default_value = config::DEFAULT_API, global = true, value_name = "ADDR:PORT")]
    pub api: SocketAddr,
    /// A file whose first line is the API token (changes need it when the switch has one);
    /// KVSWITCH_API_TOKEN works too.
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Speak HTTPS to the API, trusting the authorities of this PEM file (the API's
    /// certificate must name the address given with --api).
    #[arg(long, global = true, value_name = "FILE")]
    pub api_ca: Option<std::path::PathBuf>,
    /// The certificate chain (PEM) to show an API that asks for one (`api_tls_client_ca`);
    /// with --api-key and --api-ca.
    #[arg(long, global = true, value_name = "FILE", requires_all = ["api_key", "api_ca"])]
    pub api_cert: Option<std::path::PathBuf>,
    /// The private key of --api-cert (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "api_cert")]
    pub api_key: Option<std::path::PathBuf>,
}

impl ApiArgs {
    /// The client these arguments name, its token and TLS files read.
    pub fn client(&self) -> anyhow::Result<Client> {
        let client = Client::new(self.api, token(self.token_file.as_deref())?);
        Ok(match &self.api_ca {
            None => client,
            Some(ca) => {
                let own = self.api_cert.as_deref().zip(self.api_key.as_deref());
                client.with_https(Https::load(ca, own)?)
            }
        })
    }
}

/// HTTPS towards an API: the authorities its certificate is checked against, and the
/// certificate the client shows when asked for one.
#[derive(Clone, Debug)]
pub struct Https {
    config: ureq::tls::TlsConfig,
}

impl Https {
    /// Trusts the certificates of the PEM file `ca`; shows the chain and key of `own` (PEM
    /// files) when given. An error names the file and what is wrong with it.
    pub fn load(
        ca: &std::path::Path,
        own: Option<(&std::path::Path, &std::path::Path)>,
    ) -> anyhow::Result<Https> {
        use ureq::tls::{ClientCert, PemItem, RootCerts, TlsConfig, TlsProvider};
        let pem = |path: &std::path::Path, what: &str| -> anyhow::Result<Vec<PemItem<'static>>> {
            let bytes = std::fs::read(path)
                .with_context(|| format!("{what} {}: cannot read", path.display()))?;
            ureq::tls::parse_pem(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{what} {}: not PEM", path.display()))
        };
        let certs = |items: Vec<PemItem<'static>>| {
            items
                .into_iter()
                .filter_map(|i| match i {
                    PemItem::Certificate(c) => Some(c),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        let roots = certs(pem(ca, "TLS authority")?);
        anyhow::ensure!(
            !roots.is_empty(),
            "TLS authority {}: no certificate in it",
            ca.display()
        );
        let client_cert = match own {
            None => None,
            Some((cert, key)) => {
                let chain = certs(pem(cert, "TLS certificate")?);
                anyhow::ensure!(
                    !chain.is_empty(),
                    "TLS certificate {}: no certificate in it",
                    cert.display()
                );
                let private = pem(key, "TLS key")?
                    .into_iter()
                    .find_map(|i| match i {
                        PemItem::PrivateKey(k) => Some(k),
                        _ => None,
                    })
                    .with_context(|| format!("TLS key {}: no private key in it", key.display()))?;
                Some(ClientCert::new_with_certs(&chain, private))
            }
        };
        let config = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(tls::provider())
            .root_certs(RootCerts::new_with_certs(&roots))
            .client_cert(client_cert)
            .build();
        Ok(Https { config })
    }
}

/// A blocking client of the control API: one connection per request.
#[derive(Clone)]
pub struct Client {
    pub api: SocketAddr,
    pub token: Option<String>,
    /// How long each call waits on its reply: [`CALL_LIMIT`] unless [`Client::with_limit`]
    /// says otherwise.
    limit: Duration,
    /// HTTPS, when the API speaks it.
    https: Option<Https>,
    /// An `Authorization` header sent as it is, in place of the token as a bearer (etcd's
    /// gateway wants its own tokens so).
    authorization: Option<String>,
}

impl std::fmt::Debug for Client {
    /// Without the token or the authorization, which logs must not show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("api", &self.api)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("limit", &self.limit)
            .field("https", &self.https.is_some())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the API at `api`, sending `token` (if any) as a bearer.
    pub fn new(api: SocketAddr, token: Option<String>) -> Client {
        Client {
            api,
            token,
            limit: CALL_LIMIT,
            https: None,
            authorization: None,
        }
    }

    /// The same client, sending `value` as its `Authorization` header, as it is.
    pub fn with_authorization(self, value: String) -> Client {
        Client {
            authorization: Some(value),
            ..self
        }
    }

    /// The same client (token, HTTPS, limit) for the API at `api`: another switch of a fleet.
    pub fn at(&self, api: SocketAddr) -> Client {
        Client {
            api,
            ..self.clone()
        }
    }

    /// The same client, speaking HTTPS (`None`: HTTP).
    pub fn with_https(self, https: impl Into<Option<Https>>) -> Client {
        Client {
            https: https.into(),
            ..self
        }
    }

    /// `http` or `https`, as this client speaks to its API.
    pub fn scheme(&self) -> &'static str {
        if self.https.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The same client, each of its calls (typed or not) giving up on the reply after `limit`.
    pub fn with_limit(self, limit: Duration) -> Client {
        Client { limit, ..self }
    }

    /// An agent for one request: `limit` bounds each read and write (no read bound when
    /// `None`, for a stream), the connection opens within [`CONNECT_LIMIT`], and every status
    /// comes back as a reply for the caller to read.
    fn agent(&self, limit: Option<Duration>) -> ureq::Agent {
        let mut config = ureq::Agent::config_builder();
        if let Some(https) = &self.https {
            config = config.tls_config(https.config.clone());
        }
        config
            // Straight to the API: a proxy from the environment (HTTP_PROXY, ALL_PROXY) would take
            // loopback and namespace addresses it cannot reach, and see the token.
            .proxy(None)
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(limit.map_or(CONNECT_LIMIT, |t| t.min(CONNECT_LIMIT))))
            .timeout_per_read(limit)
            .timeout_per_write(Some(limit.unwrap_or(CALL_LIMIT)))
            .build()
            .new_agent()
    }

    /// `method path` with `body` (declared JSON, which the API's guard wants of a change),
    /// the token as a bearer, on a connection of its own.
    fn send(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        limit: Option<Duration>,
    ) -> anyhow::Result<http::Response<ureq::Body>> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}://{}{path}", self.scheme(), self.api))
            .header(http::header::CONNECTION, "close")
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(value) = &self.authorization {
            request = request.header(http::header::AUTHORIZATION, value);
        } else if let Some(t) = &self.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let request = request
            .body(body)
            .with_context(|| format!("{method} {path}: not a request this client can send"))?;
        self.agent(limit)
            .run(request)
            .map_err(|e| self.failed(method, path, e))
    }

    /// The error of a request that got no reply, naming the API and what failed.
    fn failed(&self, method: &str, path: &str, e: ureq::Error) -> anyhow::Error {
        use std::io::ErrorKind::*;
        let unreached = match &e {
            ureq::Error::Timeout(ureq::Timeout::Connect) | ureq::Error::ConnectionFailed => true,
            ureq::Error::Io(io) => matches!(
                io.kind(),
                ConnectionRefused | AddrNotAvailable | HostUnreachable | NetworkUnreachable
            ),
            _ => false,
        };
        if unreached {
            anyhow::anyhow!(
                "cannot reach the control API at {} ({e}); is kvswitch running there?",
                self.api
            )
        } else {
            anyhow::anyhow!("{method} {path} to the control API at {}: {e}", self.api)
        }
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
        let reply = self.send("GET", path, &[], None)?;
        let code = reply.status().as_u16();
        let body = reply.into_body();
        if code != 200 {
            let text = read_body(body, "GET", path)?;
            let doc: Value = serde_json::from_str(text.trim()).unwrap_or(Value::Null);
            let message = doc["error"].as_str().unwrap_or(text.trim()).to_string();
            anyhow::bail!("GET {path}: {code}: {message}");
        }
        Ok(Stream {
            path: path.to_string(),
            reader: BufReader::new(body.into_reader()),
        })
    }
}

/// A reply's whole body, as text.
fn read_body(body: ureq::Body, method: &str, path: &str) -> anyhow::Result<String> {
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut body.into_reader(), &mut raw)
        .with_context(|| format!("reading the reply to {method} {path}"))?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// An open stream of JSON lines (see [`Client::open`]).
pub struct Stream {
    path: String,
    reader: BufReader<ureq::BodyReader<'static>>,
}

impl Stream {
    /// The next line, waiting for it; `None` once the stream has ended (a last line cut off
    /// by the end is dropped).
    pub fn next_line(&mut self) -> anyhow::Result<Option<Value>> {
        let path = &self.path;
        let mut line = Vec::new();
        self.reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("GET {path}: reading the stream"))?;
        if !line.ends_with(b"\n") {
            return Ok(None);
        }
        let doc = serde_json::from_slice(&line)
            .with_context(|| format!("GET {path}: a line that is not JSON"))?;
        Ok(Some(doc))
    }
}

impl Client {
    /// `method path` with an optional JSON body, waiting on the reply for the client's limit;
    /// the reply's body as JSON (or text wrapped in a JSON string), or an error carrying the
    /// API's message.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        self.call_within(method, path, body, self.limit)
    }

    /// [`Client::call`], giving up on the reply after `limit`.
    pub fn call_within(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        limit: Duration,
    ) -> anyhow::Result<Value> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let reply = self.send(method, path, body.as_bytes(), Some(limit))?;
        let status = reply.status().as_u16();
        let body = read_body(reply.into_body(), method, path)?;
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
                kind: doc
                    .get("kind")
                    .and_then(|k| serde_json::from_value(k.clone()).ok()),
                field: doc
                    .get("field")
                    .and_then(Value::as_str)
                    .filter(|f| !f.is_empty())
                    .map(str::to_string),
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
    /// What kind of refusal the switch's control API said it was (the error body's `kind`).
    pub kind: Option<ErrorKind>,
    /// The field of the request it named, if any (`match.ip_dst`, `actions[1].output`).
    pub field: Option<String>,
}

impl Refused {
    /// Whether the switch said the entry named is not there (not the table, nor the route).
    pub fn entry_gone(&self) -> bool {
        self.kind == Some(ErrorKind::NotFound) && self.field.as_deref() != Some("table")
    }

    /// The refusal as the switch's own error, when the API said which kind it was.
    pub fn control_error(&self) -> Option<ControlError> {
        let kind = self.kind?;
        let field = self.field.clone().unwrap_or_default();
        // The body's `error` is the error as displayed: its field, then what is wrong.
        let error = self
            .message
            .strip_prefix(&format!("{field}: "))
            .unwrap_or(&self.message);
        Some(ControlError::new(kind, field, error))
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.what, self.status, self.message)
    }
}

impl std::error::Error for Refused {}

/// The token from the environment or `file`, if any.
pub fn token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    if let Ok(t) = std::env::var(TOKEN_ENV) {
        if !t.trim().is_empty() {
            return Ok(Some(t.trim().to_string()));
        }
    }
    file.map(file_token).transpose()
}

/// The token in the first line of `file`, whatever the environment says; an empty one is an
/// error.
pub fn file_token(file: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the token file {}", file.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    anyhow::ensure!(
        !token.is_empty(),
        "the token file {} is empty",
        file.display()
    );
    Ok(token.to_string())
}
