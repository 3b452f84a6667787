//! The bodies of pool changes that the switch's API and the controller's both take.

use std::net::SocketAddr;

use serde::Deserialize;
use switch::pool::ServerSpec;

/// A server to add, as `POST /api/v1/pool/servers` takes it (the controller's too).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewServer {
    /// Where to connect: `IP:PORT`.
    pub addr: SocketAddr,
    /// The host as ketama hashes it (as a configuration file spells it); the address's IP
    /// by default.
    pub host: Option<String>,
    #[serde(default = "one")]
    pub weight: u32,
    pub name: Option<String>,
    pub pool: Option<String>,
    /// Warm the server up for this long: a `get` through the proxy that misses on it is
    /// also asked of the server that held the key before, whose item it is given.
    pub warm_ms: Option<u64>,
}

/// The longest warm-up: a day.
pub const MAX_WARM_MS: u64 = 86_400_000;

impl NewServer {
    /// The warm-up asked for, checked.
    pub fn warm(&self) -> Result<Option<std::time::Duration>, String> {
        match self.warm_ms {
            None | Some(0) => Ok(None),
            Some(ms) if ms <= MAX_WARM_MS => Ok(Some(std::time::Duration::from_millis(ms))),
            Some(ms) => Err(format!("warm_ms: {ms} is more than a day ({MAX_WARM_MS})")),
        }
    }

    /// The server, as a pool holds it.
    pub fn spec(self) -> ServerSpec {
        ServerSpec {
            host: self.host.unwrap_or_else(|| self.addr.ip().to_string()),
            addr: self.addr,
            weight: self.weight,
            name: self.name,
        }
    }
}

fn one() -> u32 {
    1
}
