//! SASL towards servers that require it (`memcached -S`): every binary connection the proxy
//! opens to a server authenticates with PLAIN before it carries a client's request. memcached
//! takes SASL over its binary protocol only and then serves no text request at all, so a
//! text request to such a pool fails at once with a reply that says why.
//!
//! Clients of such servers authenticate too, since the servers would refuse them otherwise:
//! the proxy answers their SASL requests itself, against the same user and password, and
//! never passes them on, where they would authenticate a connection shared by every client.
//! With [`Sasl::requiring_clients`], a client must have authenticated before any other
//! request, as `memcached -S` wants: one that has not is refused and its connection closed.
//! The password is a file's first line, read again on [`Sasl::reload`] (SIGHUP): connections
//! open stay authenticated, new ones use the new password.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::RwLock;

use anyhow::bail;
use api::metrics::{Exposition, Kind};
use wire::memcache::binary::{opcode, status, write_response, Header, HEADER_LEN};

use super::stats::{add, get};

/// The only mechanism offered and used: the user and password in one message, which TLS to
/// the servers keeps from the network.
pub const MECHANISM: &[u8] = b"PLAIN";

/// The user the proxy authenticates as, its password, and what came of it.
pub struct Sasl {
    user: String,
    file: PathBuf,
    password: RwLock<String>,
    /// Server connections authenticated, and refused.
    auths: [AtomicU64; 2],
    /// Clients' SASL requests answered, accepted and refused.
    clients: [AtomicU64; 2],
    /// Clients must authenticate before any other request.
    required_of_clients: bool,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sasl")
            .field("user", &self.user)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// A password file's first line, without its line end; an error names the file.
fn read_password(file: &Path) -> anyhow::Result<String> {
    config::secret_line(file, "SASL password file").map_err(anyhow::Error::msg)
}

impl Sasl {
    /// Authenticates as `user` with the password on the first line of `file`.
    pub fn load(user: String, file: PathBuf) -> anyhow::Result<Sasl> {
        if user.is_empty() || user.contains('\0') {
            bail!("SASL user {user:?}: give a name without NUL bytes");
        }
        let password = read_password(&file)?;
        Ok(Sasl {
            user,
            file,
            password: RwLock::new(password),
            auths: Default::default(),
            clients: Default::default(),
            required_of_clients: false,
        })
    }

    /// The same, refusing a client's requests until it has authenticated.
    pub fn requiring_clients(self) -> Sasl {
        Sasl {
            required_of_clients: true,
            ..self
        }
    }

    /// Whether a client must authenticate before any other request.
    pub fn required_of_clients(&self) -> bool {
        self.required_of_clients
    }

    /// What memcached answers a request made before authenticating: `AUTH_ERROR` (after
    /// which it closes the connection). Counted as a refused client.
    pub fn unauthenticated(&self, request: &[u8]) -> Vec<u8> {
        add(&self.clients[1], 1);
        let (op, opaque) = Header::decode(request).map_or((0, 0), |h| (h.opcode, h.opaque));
        let mut out = Vec::new();
        wire::memcache::binary::write_error(op, status::AUTH_ERROR, opaque, &mut out);
        out
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    /// Reads the password file again; an error keeps the password in use.
    pub fn reload(&self) -> anyhow::Result<()> {
        let password = read_password(&self.file)?;
        *self.password.write().unwrap_or_else(|p| p.into_inner()) = password;
        Ok(())
    }

    fn password(&self) -> String {
        self.password
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// PLAIN's message: no authorisation identity, the user, the password.
    fn plain(&self) -> Vec<u8> {
        let password = self.password();
        let mut out = Vec::with_capacity(2 + self.user.len() + password.len());
        out.push(0);
        out.extend_from_slice(self.user.as_bytes());
        out.push(0);
        out.extend_from_slice(password.as_bytes());
        out
    }

    /// The `SASL_AUTH` request a new server connection opens with.
    pub fn auth_request(&self) -> Vec<u8> {
        let mut out = Vec::new();
        wire::memcache::binary::write_request(
            opcode::SASL_AUTH,
            MECHANISM,
            b"",
            &self.plain(),
            0,
            0,
            &mut out,
        );
        out
    }

    /// Reads the server's reply to [`Sasl::auth_request`] from the front of `buf`: `None`
    /// until it is whole, then the bytes it took and whether it authenticated (with the
    /// server's words when not). Counted.
    pub fn auth_reply(&self, buf: &[u8]) -> Option<(usize, Result<(), String>)> {
        let header = Header::decode(buf)?;
        if header.magic != wire::memcache::binary::RESPONSE_MAGIC {
            add(&self.auths[1], 1);
            let outcome = Err("not a binary reply: is the server memcached?".to_owned());
            return Some((HEADER_LEN, outcome));
        }
        let len = HEADER_LEN + header.body_len as usize;
        let body = buf.get(HEADER_LEN..len)?;
        let outcome = if header.vbucket_or_status == status::NO_ERROR {
            Ok(())
        } else {
            let said = String::from_utf8_lossy(body);
            Err(format!(
                "status {:#06x}, {:?}",
                header.vbucket_or_status,
                said.trim()
            ))
        };
        add(&self.auths[usize::from(outcome.is_err())], 1);
        Some((len, outcome))
    }

    /// The proxy's own answer to a client's binary request `request` (whole) when it is a
    /// SASL request, with whether the client is now authenticated; `None` for any other
    /// request. PLAIN with this proxy's user and password is accepted; anything else is
    /// refused as memcached refuses it.
    pub fn answer_client(&self, request: &[u8]) -> Option<(Vec<u8>, bool)> {
        let header = Header::decode(request)?;
        let op = header.opcode;
        if !matches!(
            op,
            opcode::SASL_LIST_MECHS | opcode::SASL_AUTH | opcode::SASL_STEP
        ) {
            return None;
        }
        let key_start = HEADER_LEN + usize::from(header.extras_len);
        let key_end = key_start + usize::from(header.key_len);
        let end = HEADER_LEN + header.body_len as usize;
        let key = request.get(key_start..key_end).unwrap_or_default();
        let value = request.get(key_end..end).unwrap_or_default();
        let opaque = header.opaque;
        let mut out = Vec::new();
        let mut taken = false;
        match op {
            opcode::SASL_LIST_MECHS => {
                write_response(op, status::NO_ERROR, opaque, b"", MECHANISM, &mut out)
            }
            opcode::SASL_AUTH | opcode::SASL_STEP => {
                taken = op == opcode::SASL_AUTH
                    && key == MECHANISM
                    && api::server::same(value, &self.plain());
                add(&self.clients[usize::from(!taken)], 1);
                let (status, said): (u16, &[u8]) = match taken {
                    true => (status::NO_ERROR, b"Authenticated"),
                    false => (status::AUTH_ERROR, b"Auth failure."),
                };
                write_response(op, status, opaque, b"", said, &mut out)
            }
            _ => return None,
        }
        Some((out, taken))
    }

    /// Authentications made with the servers, that took (`true`) or were refused.
    pub fn server_auths(&self, taken: bool) -> u64 {
        get(&self.auths[usize::from(!taken)])
    }

    /// The SASL families of `/metrics`.
    pub fn write_metrics(&self, m: &mut Exposition) {
        let name = "kvswitch_proxy_server_sasl_auths_total";
        m.family(
            name,
            Kind::Counter,
            "SASL authentications of new server connections, by outcome (refused: the server \
             did not take the user and password; the server then counts as failed).",
        );
        for (outcome, n) in ["done", "refused"].iter().zip(&self.auths) {
            m.sample(name, &[("outcome", outcome)], get(n));
        }
        let name = "kvswitch_proxy_client_sasl_auths_total";
        m.family(
            name,
            Kind::Counter,
            "Clients' SASL authentications, answered by the proxy, by outcome.",
        );
        for (outcome, n) in ["done", "refused"].iter().zip(&self.clients) {
            m.sample(name, &[("outcome", outcome)], get(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A password file of its own for each test, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let dir =
                std::env::temp_dir().join(format!("kvswitch-sasl-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sasl(dir: &Dir, password: &str) -> Sasl {
        let file = dir.path().join("pw");
        std::fs::write(&file, format!("{password}\nignored\n")).unwrap();
        Sasl::load("alice".into(), file).unwrap()
    }

    #[test]
    fn auth_request_is_plain_with_user_and_password() {
        let dir = Dir::new("request");
        let s = sasl(&dir, "secret");
        let req = s.auth_request();
        let parsed = wire::memcache::binary::parse_request(&req)
            .unwrap()
            .unwrap();
        assert_eq!(parsed.len, req.len());
        assert_eq!(&req[HEADER_LEN..HEADER_LEN + 5], b"PLAIN");
        assert!(req.ends_with(b"\0alice\0secret"));
    }

    #[test]
    fn server_replies_are_read_whole_and_counted() {
        let dir = Dir::new("replies");
        let s = sasl(&dir, "secret");
        let mut ok = Vec::new();
        write_response(opcode::SASL_AUTH, 0, 0, b"", b"Authenticated", &mut ok);
        assert_eq!(s.auth_reply(&ok[..ok.len() - 1]), None);
        assert_eq!(s.auth_reply(&ok), Some((ok.len(), Ok(()))));
        let mut refused = Vec::new();
        write_response(
            opcode::SASL_AUTH,
            0x20,
            0,
            b"",
            b"Auth failure.",
            &mut refused,
        );
        let (len, outcome) = s.auth_reply(&refused).unwrap();
        assert_eq!(len, refused.len());
        assert!(outcome.unwrap_err().contains("Auth failure."));
        assert_eq!((s.server_auths(true), s.server_auths(false)), (1, 1));
        let (_, outcome) = s.auth_reply(b"VERSION 1.6.0\r\n...........").unwrap();
        assert!(outcome.unwrap_err().contains("not a binary reply"));
    }

    #[test]
    fn clients_are_answered_against_the_same_password() {
        let dir = Dir::new("clients");
        let s = sasl(&dir, "secret");
        let status_of =
            |reply: (Vec<u8>, bool)| Header::decode(&reply.0).unwrap().vbucket_or_status;
        let request = |op: u8, key: &[u8], value: &[u8]| {
            let mut out = Vec::new();
            wire::memcache::binary::write_request(op, key, b"", value, 7, 0, &mut out);
            out
        };
        let ok = s.answer_client(&request(opcode::SASL_AUTH, b"PLAIN", b"\0alice\0secret"));
        assert!(ok.as_ref().is_some_and(|(_, taken)| *taken));
        assert_eq!(status_of(ok.unwrap()), status::NO_ERROR);
        let bad = s.answer_client(&request(opcode::SASL_AUTH, b"PLAIN", b"\0alice\0wrong"));
        assert_eq!(status_of(bad.unwrap()), status::AUTH_ERROR);
        let other = s.answer_client(&request(opcode::SASL_AUTH, b"CRAM-MD5", b"\0alice\0secret"));
        assert_eq!(status_of(other.unwrap()), status::AUTH_ERROR);
        let list = s
            .answer_client(&request(opcode::SASL_LIST_MECHS, b"", b""))
            .unwrap();
        assert!(list.0.ends_with(b"PLAIN") && !list.1);
        assert_eq!(s.answer_client(&request(opcode::GET, b"k", b"")), None);
        // A new password takes on reload; a file that cannot be read keeps the old one.
        std::fs::write(dir.path().join("pw"), "changed\n").unwrap();
        s.reload().unwrap();
        let ok = s.answer_client(&request(opcode::SASL_AUTH, b"PLAIN", b"\0alice\0changed"));
        assert_eq!(status_of(ok.unwrap()), status::NO_ERROR);
        std::fs::write(dir.path().join("pw"), "\n").unwrap();
        assert!(s.reload().unwrap_err().to_string().contains("empty"));
        assert!(s.auth_request().ends_with(b"\0alice\0changed"));
    }
}
