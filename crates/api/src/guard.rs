//! What every control API of kvswitch (the switch's, the proxy's and the controller's) refuses
//! before a handler sees a request, and how it bounds its clients: its own accept loop, with a
//! cap on connections and a header timeout, and request bodies read within a limit and a
//! budget shared by all of them. Nothing here changes the switch; every refusal is counted
//! (`kvswitch_api_refused_total{reason}`) and answered as `{"error": ...}`.
//!
//! Why: without a token an API on loopback takes changes from anything that reaches it, and a
//! web browser reaches it for any page it shows. A page of another origin may send a "simple"
//! request (a POST of `text/plain`, with no preflight), and a page whose name the attacker
//! points at 127.0.0.1 (DNS rebinding) is, to the browser, of the same origin as the API. So:
//!
//! - every request's `Host` must name the API: the address its connection reached (the one
//!   the client dialled), the listen address as written (even `0.0.0.0`), or `localhost`, all
//!   with the API's port, or a name of `api_hosts`. A rebound page's requests carry the
//!   attacker's name;
//! - a change (POST, PUT, PATCH, DELETE, and taking the CPU's frames) must come from no other
//!   origin: an `Origin` absent (not a browser) or the API's own, and a `Sec-Fetch-Site`
//!   absent, `same-origin` or `none`;
//! - a change's body must be declared `Content-Type: application/json`, which a browser sends
//!   to another origin only after a preflight (`OPTIONS`) that this API never grants. POST,
//!   PUT and PATCH need it even without a body (a browser sends a body-less POST to another
//!   origin without asking); a DELETE needs it only with a body, since a browser asks before
//!   any DELETE.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::ApiFailure;
pub use config::api::ApiServing;

/// The largest request body. A batch of [`switch::control::MAX_BATCH`] changes needs about
/// 2 MB (an `acl` entry is some 150 bytes of JSON); the body is refused as soon as it passes
/// this, or at once when its `Content-Length` says it will.
pub const MAX_BODY: usize = 8 << 20;
/// Body bytes all requests together may hold at once: two of the largest. A request whose
/// body would pass it is refused (503) rather than waiting, so a few clients sending large
/// bodies slowly cannot make the API hold more (eight 60 MiB bodies took a switch to 1.2 GB).
pub const BODY_BUDGET: usize = 2 * MAX_BODY;
/// How long a request's body may take to arrive once its headers have.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request or a connection was refused; each has its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A `Host` that does not name the API (DNS rebinding), or none.
    Host,
    /// A change from another web origin.
    Origin,
    /// A change whose body is not declared JSON.
    ContentType,
    /// A body longer than [`MAX_BODY`].
    BodyTooLarge,
    /// A body that would take the bodies held at once past [`BODY_BUDGET`].
    BodyBudget,
    /// A body that did not arrive whole within [`BODY_TIMEOUT`].
    BodyIncomplete,
    /// A connection past `api_max_connections`, closed as soon as it was accepted.
    Connections,
    /// A connection closed because a request's headers did not arrive within
    /// `api_header_timeout_ms` (a slow client, or an idle keep-alive connection).
    HeaderTimeout,
}

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::Host,
        Refusal::Origin,
        Refusal::ContentType,
        Refusal::BodyTooLarge,
        Refusal::BodyBudget,
        Refusal::BodyIncomplete,
        Refusal::Connections,
        Refusal::HeaderTimeout,
    ];

    /// Its `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Host => "host",
            Refusal::Origin => "origin",
            Refusal::ContentType => "content_type",
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::BodyBudget => "body_budget",
            Refusal::BodyIncomplete => "body_incomplete",
            Refusal::Connections => "connections",
            Refusal::HeaderTimeout => "header_timeout",
        }
    }
}

/// One API server's limits and counters, and its TLS when it speaks HTTPS.
pub struct Guard {
    serving: ApiServing,
    tls: Option<tls::ClientTls>,
    refused: [AtomicU64; Refusal::ALL.len()],
    /// A permit per open connection.
    connections: Arc<Semaphore>,
    /// A permit per body byte held.
    bodies: Arc<Semaphore>,
}

impl Guard {
    /// The guard of `serving`, its TLS files loaded when it has them; an error names the file
    /// that does not load.
    pub fn new(serving: ApiServing) -> anyhow::Result<Arc<Guard>> {
        let tls = serving
            .tls
            .as_ref()
            .map(|f| tls::ClientTls::load(f.cert.clone(), f.key.clone(), f.client_ca.clone()))
            .transpose()
            .map_err(|e| e.context("the API's HTTPS"))?;
        Ok(Arc::new(Guard {
            connections: Arc::new(Semaphore::new(serving.max_connections)),
            bodies: Arc::new(Semaphore::new(BODY_BUDGET)),
            refused: Default::default(),
            serving,
            tls,
        }))
    }

    /// Whether the API speaks HTTPS.
    pub fn https(&self) -> bool {
        self.tls.is_some()
    }

    /// Reads the API's TLS files again (SIGHUP), logging what came of it: new connections
    /// use them, open ones keep theirs; files that do not load leave the old ones in use.
    pub fn reload_tls(&self) {
        if let Some(tls) = &self.tls {
            match tls.reload() {
                Ok(()) => tracing::info!("the API's TLS files read again"),
                Err(e) => tracing::error!("the API's TLS files kept as they were: {e:#}"),
            }
        }
    }

    /// Requests or connections refused for `why` since start.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.refused[why as usize].load(Ordering::Relaxed)
    }

    fn count(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.serving
            .max_connections
            .saturating_sub(self.connections.available_permits())
    }

    /// The refusals and the open connections, in Prometheus text.
    pub fn write_metrics(&self, m: &mut crate::metrics::Exposition) {
        use crate::metrics::Kind;
        m.family(
            "kvswitch_api_refused_total",
            Kind::Counter,
            "Requests and connections the control API refused before any handler, by reason.",
        );
        for why in Refusal::ALL {
            m.sample(
                "kvswitch_api_refused_total",
                &[("reason", why.name())],
                self.refused(why),
            );
        }
        m.single(
            "kvswitch_api_connections",
            Kind::Gauge,
            "Connections the control API holds open (at most its api_max_connections).",
            self.open(),
        );
        if let Some(tls) = &self.tls {
            m.tls(
                "kvswitch_api_tls",
                [
                    "The control API's TLS handshakes, by how they ended (failed: refused by \
                     either side, such as a client that does not trust the certificate or shows \
                     none when one is asked for; timed_out: not done in 10 s).",
                    "Times the API's certificate files were read again (SIGHUP), by outcome \
                     (refused: the files in use were kept).",
                ],
                &tls.counts(),
            );
        }
    }

    /// The request if it may go on, with its body read whole and the budget it holds.
    async fn admit(
        &self,
        req: Request,
    ) -> Result<(Request, Option<OwnedSemaphorePermit>), Refused> {
        self.check_headers(&req)?;
        self.read_body(req).await
    }

    /// Refuses a request whose `Host` is not the API's, or a change from another origin or
    /// not sent as JSON.
    fn check_headers(&self, req: &Request) -> Result<(), Refused> {
        let reached = req.extensions().get::<Reached>().copied();
        let host = host_of(req);
        match (&host, reached) {
            (Some(h), Some(at)) if names_the_api(h, at, &self.serving.hosts) => {}
            _ => {
                let port = reached.map_or(0, |r| r.at.port());
                return Err((
                    Refusal::Host,
                    ApiFailure::new(
                        StatusCode::FORBIDDEN,
                        format!(
                            "the Host header {:?} does not name this API: reach it by its \
                             address, as localhost:{port}, or by a name listed in api_hosts \
                             (a page whose name points here is refused: DNS rebinding)",
                            host.clone().unwrap_or_default()
                        ),
                    ),
                ));
            }
        }
        let headers = req.headers();
        if is_change(req.method(), req.uri().path()) {
            let host = host.unwrap_or_default();
            if let Some(site) = foreign_origin(headers, &host) {
                return Err((
                    Refusal::Origin,
                    ApiFailure::new(
                        StatusCode::FORBIDDEN,
                        format!(
                            "changes are not taken from another web origin ({site}); send them \
                             from kvswitch ctl, a program, or a page this API serves"
                        ),
                    ),
                ));
            }
            // Taking the CPU's frames is a GET: its origin is checked, it has no body.
            let needs_json = match *req.method() {
                Method::POST | Method::PUT | Method::PATCH => true,
                Method::DELETE => has_body(headers),
                _ => false,
            };
            if needs_json && !is_json(headers) {
                return Err((
                    Refusal::ContentType,
                    ApiFailure::new(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "a change must be sent as JSON: Content-Type: application/json (POST, \
                         PUT and PATCH always, a DELETE when it has a body)",
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The request with its body read whole, within [`MAX_BODY`], [`BODY_BUDGET`] and
    /// [`BODY_TIMEOUT`], and the part of the budget it holds.
    async fn read_body(
        &self,
        req: Request,
    ) -> Result<(Request, Option<OwnedSemaphorePermit>), Refused> {
        let headers = req.headers();
        if !has_body(headers) {
            return Ok((req, None));
        }
        let too_large = || {
            (
                Refusal::BodyTooLarge,
                ApiFailure::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a request body holds at most {MAX_BODY} bytes"),
                ),
            )
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_BODY as u64) {
            return Err(too_large());
        }
        let (parts, body) = req.into_parts();
        let mut held: Option<OwnedSemaphorePermit> = None;
        let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(1 << 16) as usize);
        let mut stream = body.into_data_stream();
        let read = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| {
                    (
                        Refusal::BodyIncomplete,
                        ApiFailure::new(
                            StatusCode::BAD_REQUEST,
                            format!("the body broke off: {e}"),
                        ),
                    )
                })?;
                if bytes.len() + chunk.len() > MAX_BODY {
                    return Err(too_large());
                }
                let n = u32::try_from(chunk.len()).map_err(|_| too_large())?;
                let permit = self.bodies.clone().try_acquire_many_owned(n).map_err(|_| {
                    (
                        Refusal::BodyBudget,
                        ApiFailure::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "the API holds as many request bodies as it may \
                                     ({BODY_BUDGET} bytes in all); try again"
                            ),
                        ),
                    )
                })?;
                match &mut held {
                    Some(h) => h.merge(permit),
                    None => held = Some(permit),
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(())
        };
        let outcome = tokio::time::timeout(BODY_TIMEOUT, read).await;
        match outcome {
            Ok(Ok(())) => Ok((Request::from_parts(parts, Body::from(bytes)), held)),
            Ok(Err(refused)) => Err(refused),
            Err(_) => Err((
                Refusal::BodyIncomplete,
                ApiFailure::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the body did not arrive within {BODY_TIMEOUT:?}"),
                ),
            )),
        }
    }
}

/// Why a request was refused, and the answer it gets.
type Refused = (Refusal, ApiFailure);

/// Where a connection was accepted, put in each of its requests by [`accept`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reached {
    /// The connection's own address: the one the client dialled.
    pub at: SocketAddr,
    /// The listener's address (`0.0.0.0:PORT` when it listens on every address).
    pub listen: SocketAddr,
}

/// The middleware: refuses what [`Guard`] refuses, else runs the request with its body read.
async fn check(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    match guard.admit(req).await {
        Ok((req, held)) => {
            let reply = next.run(req).await;
            // The body's budget is given back once the handler is done with it.
            drop(held);
            reply
        }
        Err((why, failure)) => {
            guard.count(why);
            failure.into_response()
        }
    }
}

/// `app` behind `guard`'s checks.
pub(crate) fn guarded(app: Router, guard: &Arc<Guard>) -> Router {
    app.layer(middleware::from_fn_with_state(guard.clone(), check))
}

/// Accepts connections on `listener` and serves `app` (made by [`guarded`]) on each, HTTP/1
/// only, at most `api_max_connections` at once: a connection past them is closed as soon as
/// it is accepted. A request's line and headers must arrive within `api_header_timeout_ms`,
/// counted from the connection's opening or the end of its previous response, so an idle
/// keep-alive connection is closed after as long (hyper's one timer does both).
pub(crate) async fn accept(listener: tokio::net::TcpListener, app: Router, guard: Arc<Guard>) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(guard.serving.header_timeout)
        .keep_alive(true);
    loop {
        let socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(e) => {
                // Out of descriptors (EMFILE), or a connection reset before it was taken:
                // wait a little rather than spin.
                tracing::debug!("the API cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(place) = guard.connections.clone().try_acquire_owned() else {
            guard.count(Refusal::Connections);
            drop(socket);
            continue;
        };
        let (Ok(at), Ok(listen)) = (socket.local_addr(), listener.local_addr()) else {
            continue;
        };
        let reached = Reached { at, listen };
        let _ = socket.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(reached);
            tower::ServiceExt::oneshot(app.clone(), req)
        });
        let http = http.clone();
        let guard = guard.clone();
        tokio::spawn(async move {
            let served = match &guard.tls {
                None => http.serve_connection(TokioIo::new(socket), service).await,
                Some(tls) => {
                    let shaken =
                        tokio::time::timeout(tls::HANDSHAKE_LIMIT, tls.acceptor().accept(socket))
                            .await;
                    let stream = match shaken {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tls.count(tls::Handshake::Failed);
                            tracing::debug!("an API client's TLS handshake failed: {e}");
                            return;
                        }
                        Err(_) => {
                            tls.count(tls::Handshake::TimedOut);
                            return;
                        }
                    };
                    tls.count(tls::Handshake::Done);
                    http.serve_connection(TokioIo::new(stream), service).await
                }
            };
            if let Err(e) = served {
                if e.is_timeout() {
                    guard.count(Refusal::HeaderTimeout);
                }
            }
            drop(place);
        });
    }
}

/// Whether a request of `method` on `path` changes something: every write, and taking the
/// CPU's frames (which takes them from every other reader).
fn is_change(method: &Method, path: &str) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) || path.starts_with("/api/v1/packets")
}

/// The request's `Host` header (or its URI's authority), when it has one.
fn host_of(req: &Request) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()))
}

/// Whether `host` (a `Host` header's value) names an API whose connection was accepted as
/// `reached` says: the address the client dialled, the listen address (as written, even
/// `0.0.0.0`, which clients on the host dial), or `localhost`, with the API's port (80 when
/// none is given); or one of `extra` (`name`, with the API's port or none, or `name:port` as
/// given). An IP address the API is not reached at, or any other name, is not the API's: a
/// page whose name was pointed here sends its own name.
fn names_the_api(host: &str, reached: Reached, extra: &[String]) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let port = reached.at.port();
    if extra
        .iter()
        .any(|h| *h == host || format!("{h}:{port}") == host)
    {
        return true;
    }
    let (name, given) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((name, "")) => (name, None),
            Some((name, tail)) => match tail.strip_prefix(':') {
                Some(p) => (name, Some(p)),
                None => return false,
            },
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, p)) => (name, Some(p)),
            None => (host.as_str(), None),
        },
    };
    let given = match given.map(str::parse::<u16>) {
        None => 80,
        Some(Ok(p)) => p,
        Some(Err(_)) => return false,
    };
    let own = name == "localhost"
        || name.parse::<IpAddr>().is_ok_and(|ip| {
            [reached.at.ip(), reached.listen.ip()]
                .iter()
                .any(|own| own.to_canonical() == ip.to_canonical())
        });
    own && given == port
}

/// The other site a change comes from, if it comes from one: an `Origin` other than
/// `http://HOST` or `https://HOST` (`null` included), or a `Sec-Fetch-Site` other than
/// `same-origin` or `none` (a browser's own navigation).
fn foreign_origin(headers: &HeaderMap, host: &str) -> Option<String> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("").trim();
        let own = ["http://", "https://"].iter().any(|scheme| {
            origin
                .strip_prefix(scheme)
                .is_some_and(|o| o.eq_ignore_ascii_case(host.trim()))
        });
        if !own {
            return Some(format!("Origin: {origin}"));
        }
    }
    let site = headers
        .get("sec-fetch-site")
        .map(|v| v.to_str().unwrap_or("").trim().to_ascii_lowercase());
    match site.as_deref() {
        None | Some("same-origin") | Some("none") => None,
        Some(other) => Some(format!("Sec-Fetch-Site: {other}")),
    }
}

/// Whether the request says it has a body (a `Content-Length` above 0, or chunks).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// Whether the body is declared `application/json` (parameters such as a charset allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_host_names_the_api_by_its_address_localhost_or_a_listed_name() {
        let reached = |at: &str, listen: &str| Reached {
            at: at.parse().unwrap(),
            listen: listen.parse().unwrap(),
        };
        let at = reached("127.0.0.1:9110", "127.0.0.1:9110");
        let listed = ["switch1.example".to_string(), "nat.example:80".to_string()];
        for ok in [
            "127.0.0.1:9110",
            "localhost:9110",
            "LOCALHOST:9110",
            "switch1.example",
            "switch1.example:9110",
            "nat.example:80",
        ] {
            assert!(names_the_api(ok, at, &listed), "{ok}");
        }
        for bad in [
            "evil.example:9110",
            "127.0.0.1:9111",
            "127.0.0.1",
            "localhost",
            "127.0.0.2:9110",
            "switch1.example:9111",
            "127.0.0.1:x",
            "",
        ] {
            assert!(!names_the_api(bad, at, &listed), "{bad}");
        }
        let v6 = reached("[::1]:9110", "[::1]:9110");
        assert!(names_the_api("[::1]:9110", v6, &[]));
        assert!(!names_the_api("[::1]", v6, &[]));
        // A listener on [::] takes IPv4 clients as mapped addresses.
        let mapped = reached("[::ffff:10.0.0.1]:9110", "[::]:9110");
        assert!(names_the_api("10.0.0.1:9110", mapped, &[]));
        // A listener on 0.0.0.0, dialled as 0.0.0.0 (the connection is 127.0.0.1's) or by
        // another of its addresses; not by an address it was not reached at.
        let any = reached("127.0.0.1:9110", "0.0.0.0:9110");
        assert!(names_the_api("0.0.0.0:9110", any, &[]));
        assert!(names_the_api("127.0.0.1:9110", any, &[]));
        assert!(!names_the_api("10.0.0.1:9110", any, &[]));
        assert!(!names_the_api("0.0.0.0:9111", any, &[]));
    }

    #[test]
    fn a_change_from_another_origin_is_named() {
        let mut h = HeaderMap::new();
        assert_eq!(foreign_origin(&h, "127.0.0.1:9110"), None);
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9110"),
        );
        assert_eq!(foreign_origin(&h, "127.0.0.1:9110"), None);
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(foreign_origin(&h, "127.0.0.1:9110").is_some());
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(foreign_origin(&h, "127.0.0.1:9110").is_some());
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(foreign_origin(&h, "127.0.0.1:9110").is_some());
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert_eq!(foreign_origin(&h, "127.0.0.1:9110"), None);
    }

    #[test]
    fn only_json_is_json() {
        let mut h = HeaderMap::new();
        assert!(!is_json(&h));
        for (value, json) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
            ("multipart/form-data; boundary=x", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_json(&h), json, "{value}");
        }
    }
}
