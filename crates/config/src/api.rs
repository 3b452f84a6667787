//! How an HTTP control API bounds its clients and whether it speaks HTTPS: the same keys in
//! `[switch]`, `[proxy]` and `[controller]` (`api_max_connections`, `api_header_timeout_ms`,
//! `api_hosts`, `api_tls_cert`, `api_tls_key`, `api_tls_client_ca`), checked here once so that
//! they mean the same and fail the same way in every file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::proxy::TlsFiles;
use crate::ConfigError;

/// Connections an API holds open at once by default; past them a new one is closed at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// The most `api_max_connections` may be: each connection costs a descriptor the API shares
/// with the proxy's clients.
pub const MAX_CONNECTIONS: usize = 4096;
/// How long a client has by default to send a request's line and headers.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How an API serves its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServing {
    /// Connections held open at once (`api_max_connections`); a connection past them is
    /// closed as soon as it is accepted.
    pub max_connections: usize,
    /// The time a client has to send a request's line and headers, from the connection's
    /// opening or the end of the previous response (`api_header_timeout_ms`): so also how
    /// long an idle keep-alive connection is kept.
    pub header_timeout: Duration,
    /// Names the API is reached by besides its own address and `localhost`
    /// (`api_hosts`: `name` or `name:port`, lowercase), as a request's `Host` header gives
    /// them: those of a reverse proxy, a port mapping or a DNS name of the host.
    pub hosts: Vec<String>,
    /// HTTPS: the certificate chain, its key and, to ask clients for certificates, their
    /// authorities (`api_tls_cert`, `api_tls_key`, `api_tls_client_ca`; relative to the file).
    pub tls: Option<TlsFiles>,
}

impl Default for ApiServing {
    fn default() -> ApiServing {
        ApiServing {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            hosts: Vec::new(),
            tls: None,
        }
    }
}

/// The three keys of `section` as a file gives them.
#[derive(Debug, Default)]
pub(crate) struct RawApiServing {
    pub max_connections: Option<usize>,
    pub header_timeout_ms: Option<u64>,
    pub hosts: Option<Vec<String>>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
}

impl RawApiServing {
    /// Checks the keys; an error names `section.key`.
    pub(crate) fn check(self, path: &Path, section: &str) -> Result<ApiServing, ConfigError> {
        let err = |key: &str, message: String| {
            ConfigError::new(path, &format!("{section}.{key}"), message)
        };
        let max_connections = self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if !(1..=MAX_CONNECTIONS).contains(&max_connections) {
            return Err(err(
                "api_max_connections",
                format!("{max_connections} is out of range; use 1 to {MAX_CONNECTIONS}"),
            ));
        }
        let ms = self
            .header_timeout_ms
            .unwrap_or(DEFAULT_HEADER_TIMEOUT.as_millis() as u64);
        if !(10..=600_000).contains(&ms) {
            return Err(err(
                "api_header_timeout_ms",
                format!("{ms} is out of range; use 10 to 600000"),
            ));
        }
        let mut hosts = Vec::new();
        for (i, host) in self.hosts.unwrap_or_default().into_iter().enumerate() {
            let host = host.trim().to_ascii_lowercase();
            let plain = host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
            if host.is_empty() || !plain {
                return Err(err(
                    &format!("api_hosts[{i}]"),
                    format!(
                        "`{host}` is not a name as a Host header gives it, such as \
                         switch1.example or switch1.example:9110"
                    ),
                ));
            }
            hosts.push(host);
        }
        let beside = |f: Option<PathBuf>| f.map(|f| path.parent().unwrap_or(Path::new("")).join(f));
        let tls = TlsFiles::from_parts(
            beside(self.tls_cert),
            beside(self.tls_key),
            beside(self.tls_client_ca),
            |k| format!("{section}.api_{k}"),
        )
        .map_err(|(k, e)| ConfigError::new(path, &k, e))?;
        Ok(ApiServing {
            max_connections,
            header_timeout: Duration::from_millis(ms),
            hosts,
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_default_and_are_checked() {
        let path = Path::new("f.toml");
        assert_eq!(
            RawApiServing::default().check(path, "switch").unwrap(),
            ApiServing::default()
        );
        let set = RawApiServing {
            max_connections: Some(8),
            header_timeout_ms: Some(250),
            hosts: Some(vec!["Switch1.Example:9110".into()]),
            ..RawApiServing::default()
        }
        .check(path, "proxy")
        .unwrap();
        assert_eq!(set.max_connections, 8);
        assert_eq!(set.header_timeout, Duration::from_millis(250));
        assert_eq!(set.hosts, ["switch1.example:9110"]);
        let e = RawApiServing {
            max_connections: Some(0),
            ..RawApiServing::default()
        }
        .check(path, "switch")
        .unwrap_err();
        assert_eq!(e.key, "switch.api_max_connections");
        let e = RawApiServing {
            hosts: Some(vec!["http://evil/".into()]),
            ..RawApiServing::default()
        }
        .check(path, "controller")
        .unwrap_err();
        assert_eq!(e.key, "controller.api_hosts[0]");
        let https = RawApiServing {
            tls_cert: Some("api.crt".into()),
            tls_key: Some("/etc/kvswitch/api.key".into()),
            ..RawApiServing::default()
        }
        .check(Path::new("/srv/switch.toml"), "switch")
        .unwrap();
        let tls = https.tls.expect("https");
        assert_eq!(tls.cert, Path::new("/srv/api.crt"));
        assert_eq!(tls.key, Path::new("/etc/kvswitch/api.key"));
        let e = RawApiServing {
            tls_cert: Some("api.crt".into()),
            ..RawApiServing::default()
        }
        .check(path, "proxy")
        .unwrap_err();
        assert_eq!(e.key, "proxy.api_tls_key");
    }
}
