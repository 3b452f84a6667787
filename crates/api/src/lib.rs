//! The control APIs' common ground: [`client::Client`], the blocking client every part of
//! kvswitch and its tools speak to an API with, typed for a switch's tables, batches,
//! interfaces, counters, registers, ports and CPU path; what serving one takes ([`server`],
//! behind the [`guard`] that refuses what a browser of another origin could send); the error
//! body all of them answer with ([`ApiFailure`]); the token; and the dashboard page, served by
//! a switch for itself and by the controller for its fleet.

pub mod client;
mod control;
mod error;
pub mod guard;
pub mod metrics;
pub mod pool;
pub mod server;

pub use client::{ApiArgs, Client, Refused};
pub use error::{body, ApiFailure};

use std::net::SocketAddr;

/// The dashboard: one page that reads `/api/v1/fleet` (the controller's, or a switch's own as
/// a fleet of one).
pub const DASHBOARD: &str = include_str!("dashboard.html");

/// The environment variable that holds the API token.
pub const TOKEN_ENV: &str = "KVSWITCH_API_TOKEN";

/// The token changes through an API on `listen` need: from [`TOKEN_ENV`], else the first line
/// of `file`. An API that listens beyond this host must have one.
pub fn api_token(
    file: Option<&std::path::Path>,
    listen: SocketAddr,
) -> anyhow::Result<Option<String>> {
    let token = match (std::env::var(TOKEN_ENV), file) {
        (Ok(t), _) if !t.trim().is_empty() => Some(t.trim().to_string()),
        (_, Some(f)) => {
            let text = std::fs::read_to_string(f).map_err(|e| {
                anyhow::anyhow!("cannot read the API token file {}: {e}", f.display())
            })?;
            let line = text.lines().next().unwrap_or("").trim().to_string();
            if line.is_empty() {
                anyhow::bail!("the API token file {} is empty", f.display());
            }
            Some(line)
        }
        _ => None,
    };
    if token.is_none() && !listen.ip().is_loopback() {
        anyhow::bail!(
            "the API listens on {listen}, beyond this host: set a token for changes \
             (`api_token_file` in the configuration, or {TOKEN_ENV})"
        );
    }
    Ok(token)
}

/// What [`percent_encode`] leaves as it is: RFC 3986's unreserved characters.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `bytes` with everything but unreserved characters as `%XX`.
pub fn percent_encode(bytes: &[u8]) -> String {
    percent_encoding::percent_encode(bytes, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_encode_keeps_only_unreserved_characters() {
        assert_eq!(super::percent_encode(b"aZ9-_.~"), "aZ9-_.~");
        assert_eq!(
            super::percent_encode(b"a b/c?d=e&f+%\xff"),
            "a%20b%2Fc%3Fd%3De%26f%2B%25%FF"
        );
    }
}
