//! The controller's state in etcd, and the election of one leader among several controllers,
//! through etcd's v3 JSON gateway (`/v3/kv/...`, `/v3/lease/...`): no consensus of our own.
//!
//! The leader holds the key `<prefix>leader` under a lease it keeps alive; a standby tries to
//! create the key (a transaction that succeeds only while no one holds it) and leads once the
//! old leader's lease has run out. The pool's servers live under `<prefix>servers`.
//!
//! etcd may be reached over TLS (`https://`, with the authorities to trust and optionally a
//! client certificate) and with etcd's own users: the controller authenticates with a user and
//! password, sends the token etcd gives, and authenticates again when etcd no longer takes it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine;
use serde_json::{json, Value};
use switch::pool::ServerSpec;

use api::Client;

/// How long a leader's lease lasts without a keep-alive: a standby takes over this long after
/// the leader dies, at most (plus one campaign interval).
pub const LEASE_TTL: Duration = Duration::from_secs(2);

/// The longest one call to etcd may take: well inside the lease, so that a leader that cannot
/// renew knows it before a standby can lead.
pub const ETCD_WAIT: Duration = Duration::from_millis(500);

/// How long before its lease runs out by its own clock a leader stops acting.
pub const LEAD_MARGIN: Duration = Duration::from_millis(500);

/// An etcd server and the keys of one pool's controllers.
pub struct Etcd {
    client: Client,
    prefix: String,
    /// The lease this controller leads under, while it leads.
    lease: Option<String>,
    /// etcd's user this controller authenticates as, when etcd has authentication on.
    user: Option<User>,
}

/// How the controller reaches etcd beyond its address: TLS, and one of etcd's users.
#[derive(Default)]
pub struct Access {
    /// HTTPS, needed for an `https://` URL.
    pub https: Option<api::client::Https>,
    /// The user, and the file whose first line is its password.
    pub user: Option<(String, PathBuf)>,
}

/// One of etcd's users, and the token etcd gave it last.
struct User {
    name: String,
    password_file: PathBuf,
    token: Mutex<Option<String>>,
}

impl Etcd {
    /// `url` is `etcd://HOST:PORT` (or `http://HOST:PORT`), or `https://HOST:PORT` with
    /// `access.https`; the keys go under `/kvswitch/controller/<pool>/`.
    pub fn new(url: &str, pool: &str, access: Access) -> anyhow::Result<Etcd> {
        let (addr, tls) = match url.split_once("://") {
            Some(("etcd" | "http", addr)) => (addr, false),
            Some(("https", addr)) => (addr, true),
            _ => anyhow::bail!("{url:?}: write etcd://HOST:PORT, or https://HOST:PORT for TLS"),
        };
        let api: SocketAddr = addr.trim_end_matches('/').parse().with_context(|| {
            format!("{url:?}: {addr:?} is not an address such as 127.0.0.1:2379")
        })?;
        let client = match (tls, access.https) {
            (true, Some(https)) => Client::new(api, None).with_https(https),
            (true, None) => anyhow::bail!(
                "{url:?}: etcd over TLS needs the authority its certificate is checked against \
                 (--store-ca)"
            ),
            (false, Some(_)) => {
                anyhow::bail!("{url:?}: TLS files are given for etcd, but the URL is not https://")
            }
            (false, None) => Client::new(api, None),
        };
        let user = access.user.map(|(name, password_file)| User {
            name,
            password_file,
            token: Mutex::new(None),
        });
        let etcd = Etcd {
            client,
            prefix: format!("/kvswitch/controller/{pool}/"),
            lease: None,
            user,
        };
        // A wrong password or file is said at start, not at the first election; etcd out of
        // reach is not an error yet (the controller stands by until it answers).
        if let Some(user) = &etcd.user {
            if let Err(e) = etcd.authenticate(user) {
                let refused = e
                    .chain()
                    .any(|c| c.downcast_ref::<api::Refused>().is_some());
                if refused || e.to_string().contains("password file") {
                    return Err(e);
                }
                tracing::warn!("etcd: {e:#}; trying again as the controller campaigns");
            }
        }
        Ok(etcd)
    }

    /// Asks etcd for a token for `user`, and keeps it.
    fn authenticate(&self, user: &User) -> anyhow::Result<String> {
        let password = config::secret_line(&user.password_file, "etcd password file")
            .map_err(anyhow::Error::msg)?;
        let doc = self
            .client
            .call_within(
                "POST",
                "/v3/auth/authenticate",
                Some(&json!({ "name": user.name, "password": password })),
                ETCD_WAIT,
            )
            .with_context(|| format!("etcd did not authenticate the user {:?}", user.name))?;
        let token = doc["token"]
            .as_str()
            .context("etcd authenticated without giving a token")?
            .to_string();
        *user.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
        Ok(token)
    }

    /// One call to etcd's gateway, given at most [`ETCD_WAIT`]; with a user, its token sent,
    /// and asked for again once if etcd no longer takes it (tokens expire).
    fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let Some(user) = &self.user else {
            return self.client.call_within("POST", path, Some(body), ETCD_WAIT);
        };
        let mut fresh = false;
        loop {
            let kept = user.token.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let token = match kept {
                Some(token) => token,
                None => {
                    fresh = true;
                    self.authenticate(user)?
                }
            };
            let client = self.client.clone().with_authorization(token);
            match client.call_within("POST", path, Some(body), ETCD_WAIT) {
                Err(e) if !fresh && token_refused(&e) => {
                    *user.token.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                done => return done,
            }
        }
    }

    /// Lets go of the lead: after a failure part way through taking it, and when the
    /// controller stops.
    pub fn forget(&mut self) {
        if let Some(lease) = self.lease.take() {
            let _ = self.post("/v3/lease/revoke", &json!({ "ID": lease }));
        }
    }

    fn key(&self, name: &str) -> String {
        encode(format!("{}{name}", self.prefix).as_bytes())
    }

    /// The value of `name`, if set.
    pub(super) fn get(&self, name: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let doc = self.post("/v3/kv/range", &json!({ "key": self.key(name) }))?;
        match doc["kvs"][0]["value"].as_str() {
            Some(v) => Ok(Some(
                decode(v).context("etcd sent a value that is not base64")?,
            )),
            // A key with an empty value has no `value` field.
            None if doc["kvs"][0].is_object() => Ok(Some(Vec::new())),
            None => Ok(None),
        }
    }

    /// Whether this controller leads now (as far as it knows).
    pub fn leads(&self) -> bool {
        self.lease.is_some()
    }

    /// Who leads: the leader's API address as it wrote it.
    pub fn leader(&self) -> anyhow::Result<Option<String>> {
        Ok(self
            .get("leader")?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Tries to lead, as `me`; true if this controller leads now.
    pub fn campaign(&mut self, me: &str) -> anyhow::Result<bool> {
        if self.lease.is_some() {
            return Ok(true);
        }
        let ttl = LEASE_TTL.as_secs().max(1);
        let grant = self.post("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))?;
        let lease = grant["ID"]
            .as_str()
            .context("etcd granted a lease without an ID")?
            .to_string();
        let key = self.key("leader");
        let txn = json!({
            "compare": [{"key": key, "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": encode(me.as_bytes()), "lease": lease}}],
            "failure": [],
        });
        let done = self.post("/v3/kv/txn", &txn)?;
        if done["succeeded"] == true {
            self.lease = Some(lease);
            return Ok(true);
        }
        // Someone else leads; let the unused lease go.
        let _ = self.post("/v3/lease/revoke", &json!({ "ID": lease }));
        Ok(false)
    }

    /// Keeps the lease alive; false (and no longer leading) if it has run out or etcd cannot
    /// be reached, so that the controller stops acting before a standby starts.
    pub fn keep_leading(&mut self) -> bool {
        let Some(lease) = self.lease.clone() else {
            return false;
        };
        let alive = self
            .post("/v3/lease/keepalive", &json!({ "ID": lease }))
            .ok()
            .and_then(|d| {
                d["result"]["TTL"]
                    .as_str()
                    .and_then(|t| t.parse::<u64>().ok())
            })
            .is_some_and(|ttl| ttl > 0);
        if !alive {
            self.lease = None;
        }
        alive
    }

    /// The pool's servers as stored, if they are.
    pub fn servers(&self) -> anyhow::Result<Option<Vec<ServerSpec>>> {
        let Some(bytes) = self.get("servers")? else {
            return Ok(None);
        };
        let doc: Value =
            serde_json::from_slice(&bytes).context("the stored servers are not JSON")?;
        let mut out = Vec::new();
        for s in doc
            .as_array()
            .context("the stored servers are not a list")?
        {
            let addr: SocketAddr = s["addr"]
                .as_str()
                .and_then(|a| a.parse().ok())
                .context("a stored server without an address")?;
            let weight = s["weight"]
                .as_u64()
                .and_then(|w| u32::try_from(w).ok())
                .filter(|&w| w > 0)
                .context("a stored server without a weight of 1 or more")?;
            let host = s["host"]
                .as_str()
                .filter(|h| !h.is_empty())
                .context("a stored server without a host")?;
            let server = ServerSpec {
                host: host.to_string(),
                addr,
                weight,
                name: s["name"].as_str().map(str::to_string),
            };
            if out.iter().any(|o: &ServerSpec| o.label() == server.label()) {
                bail!("the stored servers name {} twice", server.label());
            }
            out.push(server);
        }
        if out.len() > switch::pool::MAX_SERVERS {
            bail!(
                "{} stored servers; a pool holds at most {}",
                out.len(),
                switch::pool::MAX_SERVERS
            );
        }
        Ok(Some(out))
    }

    /// Stores the pool's servers; only while leading.
    pub fn store_servers(&self, servers: &[ServerSpec]) -> anyhow::Result<()> {
        let list: Vec<Value> = servers
            .iter()
            .map(|s| json!({"host": s.host, "addr": s.addr.to_string(), "weight": s.weight, "name": s.name}))
            .collect();
        self.put_while_leading("servers", &serde_json::to_vec(&list)?)
    }

    /// Sets `name` to `value`, only while this controller's leader key stands under its lease.
    pub(super) fn put_while_leading(&self, name: &str, value: &[u8]) -> anyhow::Result<()> {
        let Some(lease) = &self.lease else {
            bail!("this controller does not lead");
        };
        let txn = json!({
            "compare": [{"key": self.key("leader"), "target": "LEASE", "lease": lease}],
            "success": [{"request_put": {"key": self.key(name), "value": encode(value)}}],
            "failure": [],
        });
        let done = self.post("/v3/kv/txn", &txn)?;
        if done["succeeded"] != true {
            bail!("this controller no longer leads");
        }
        Ok(())
    }
}

/// Whether etcd refused a call for its token: expired, or revoked.
fn token_refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<api::Refused>()
        .is_some_and(|r| r.status == 401 || r.message.contains("auth token"))
}

/// etcd's gateway writes bytes as standard base64 with padding; a value without its padding
/// is read too.
const BASE64: base64::engine::GeneralPurpose =
    base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT;

/// Standard base64 with padding, as etcd's gateway writes bytes.
pub fn encode(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// The bytes of standard base64; `None` if it is not.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_as_etcd_writes_it() {
        assert_eq!(encode(b"/k"), "L2s=");
        assert_eq!(encode(b"me"), "bWU=");
        assert_eq!(encode(b"abc"), "YWJj");
        assert_eq!(encode(b""), "");
        for n in 0..40u8 {
            let bytes: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37)).collect();
            assert_eq!(decode(&encode(&bytes)).unwrap(), bytes);
        }
        assert_eq!(decode("bWU="), Some(b"me".to_vec()));
        assert_eq!(decode("b!U="), None);
    }
}
