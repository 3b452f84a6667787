//! TLS for kvswitch's listeners and for the connections it makes, with rustls on ring and PEM
//! files: [`ClientTls`] for a listener (the proxy's clients as `memcached -Z` serves them, the
//! control APIs' HTTPS), [`ServerTls`] for connections out (the proxy to `memcached -Z`
//! servers). The files are read again on `reload` (SIGHUP): connections open keep the session
//! they made, new ones get the new files; files that do not load leave the old ones in use.
//! Handshakes and reloads are counted ([`Counts`]) for the caller's `/metrics`.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// The cryptography every TLS configuration of kvswitch uses: rustls's ring provider.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn add(n: &AtomicU64, by: u64) {
    n.fetch_add(by, Ordering::Relaxed);
}

fn get(n: &AtomicU64) -> u64 {
    n.load(Ordering::Relaxed)
}

/// What came of a configuration's handshakes and reloads, labelled as `/metrics` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// By outcome: `done`, `failed`, `timed_out`.
    pub handshakes: [(&'static str, u64); 3],
    /// By outcome: `done`, `refused` (the files in use kept).
    pub reloads: [(&'static str, u64); 2],
}

/// How long a client has to finish its handshake.
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

/// How a handshake ended, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    Done,
    Failed,
    TimedOut,
}

const HANDSHAKES: [(Handshake, &str); 3] = [
    (Handshake::Done, "done"),
    (Handshake::Failed, "failed"),
    (Handshake::TimedOut, "timed_out"),
];

/// The clients' TLS: the files, the configuration made from them, and what came of it.
pub struct ClientTls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    kept: Kept<ServerConfig>,
}

/// A TLS configuration in use, swapped whole when its files are read again, and what came of
/// its handshakes and reloads: what the clients' side and the servers' side share.
struct Kept<C> {
    config: RwLock<Arc<C>>,
    handshakes: [AtomicU64; 3],
    /// Reloads that took, and those refused (the old files kept).
    reloads: [AtomicU64; 2],
}

impl<C> Kept<C> {
    fn new(config: C) -> Kept<C> {
        Kept {
            config: RwLock::new(Arc::new(config)),
            handshakes: Default::default(),
            reloads: Default::default(),
        }
    }

    /// The configuration in use now.
    fn current(&self) -> Arc<C> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts a reloaded configuration in use, or keeps the one in use when it did not load;
    /// either way counted.
    fn reload(&self, loaded: anyhow::Result<C>) -> anyhow::Result<()> {
        match loaded {
            Ok(config) => {
                *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
                add(&self.reloads[0], 1);
                Ok(())
            }
            Err(e) => {
                add(&self.reloads[1], 1);
                Err(e)
            }
        }
    }

    fn count(&self, how: Handshake) {
        if let Some(i) = HANDSHAKES.iter().position(|(h, _)| *h == how) {
            add(&self.handshakes[i], 1);
        }
    }

    fn handshakes(&self, how: Handshake) -> u64 {
        HANDSHAKES
            .iter()
            .position(|(h, _)| *h == how)
            .map_or(0, |i| get(&self.handshakes[i]))
    }

    fn counts(&self) -> Counts {
        Counts {
            handshakes: std::array::from_fn(|i| (HANDSHAKES[i].1, get(&self.handshakes[i]))),
            reloads: [
                ("done", get(&self.reloads[0])),
                ("refused", get(&self.reloads[1])),
            ],
        }
    }
}

impl ClientTls {
    /// Loads the certificate chain `cert`, its key `key` and, when clients must show a
    /// certificate, the authorities `client_ca`; an error names the file and what is wrong.
    pub fn load(cert: PathBuf, key: PathBuf, client_ca: Option<PathBuf>) -> anyhow::Result<Self> {
        let config = server_config(&cert, &key, client_ca.as_deref())?;
        Ok(ClientTls {
            cert,
            key,
            client_ca,
            kept: Kept::new(config),
        })
    }

    /// Reads the files again; new connections use them from here on. On an error the files
    /// in use stay, and the error says why.
    pub fn reload(&self) -> anyhow::Result<()> {
        let loaded = server_config(&self.cert, &self.key, self.client_ca.as_deref());
        self.kept.reload(loaded)
    }

    /// An acceptor on the configuration in use now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.kept.current())
    }

    pub fn count(&self, how: Handshake) {
        self.kept.count(how);
    }

    /// Handshakes that ended `how`.
    pub fn handshakes(&self, how: Handshake) -> u64 {
        self.kept.handshakes(how)
    }

    /// What came of the handshakes and reloads.
    pub fn counts(&self) -> Counts {
        self.kept.counts()
    }
}

fn open(path: &Path, what: &str) -> anyhow::Result<BufReader<File>> {
    File::open(path)
        .map(BufReader::new)
        .with_context(|| format!("{what} {}: cannot read", path.display()))
}

/// The rustls configuration of the files.
fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<ServerConfig> {
    let (chain, private) = chain_and_key(cert, key)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS: no protocol version to offer")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = roots(ca, "TLS client authority")?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("TLS client authority {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(chain, private).with_context(|| {
        format!(
            "TLS key {} does not go with the certificate {}",
            key.display(),
            cert.display()
        )
    })
}

/// TLS towards the servers (`memcached -Z`): every connection to a server of the proxy's
/// pools is made over TLS, the server's certificate checked against the authorities of a PEM
/// file and the server's host as the pool names it; with a certificate and key of its own,
/// the proxy shows them to servers that ask.
pub struct ServerTls {
    ca: PathBuf,
    own: Option<(PathBuf, PathBuf)>,
    kept: Kept<rustls::ClientConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("ca", &self.ca)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Trusts the certificates of `ca`; shows the certificate and key of `own` when given.
    pub fn load(ca: PathBuf, own: Option<(PathBuf, PathBuf)>) -> anyhow::Result<ServerTls> {
        let config = client_config(&ca, own.as_ref())?;
        Ok(ServerTls {
            ca,
            own,
            kept: Kept::new(config),
        })
    }

    /// Reads the files again; connections made from here on use them. On an error the files
    /// in use stay, and the error says why.
    pub fn reload(&self) -> anyhow::Result<()> {
        self.kept.reload(client_config(&self.ca, self.own.as_ref()))
    }

    /// A TLS connection over `stream` to the server named `host` (a hostname or an address,
    /// as the pool writes it), its certificate checked.
    pub async fn connect(
        &self,
        host: &str,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{host}: not a name for TLS: {e}"),
            )
        })?;
        let connector = tokio_rustls::TlsConnector::from(self.kept.current());
        let result = connector.connect(name, stream).await;
        self.kept.count(match &result {
            Ok(_) => Handshake::Done,
            Err(_) => Handshake::Failed,
        });
        result
    }

    /// Counts a handshake that ended `how` outside [`ServerTls::connect`], such as one the
    /// caller's time limit cut short.
    pub fn count(&self, how: Handshake) {
        self.kept.count(how);
    }

    /// What came of the handshakes and reloads.
    pub fn counts(&self) -> Counts {
        self.kept.counts()
    }
}

/// The rustls configuration towards servers: their certificates checked against `ca`, and
/// `own` shown to those that ask.
fn client_config(
    ca: &Path,
    own: Option<&(PathBuf, PathBuf)>,
) -> anyhow::Result<rustls::ClientConfig> {
    let roots = roots(ca, "TLS server authority")?;
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS: no protocol version to offer")?
        .with_root_certificates(roots);
    Ok(match own {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let (chain, private) = chain_and_key(cert, key)?;
            builder
                .with_client_auth_cert(chain, private)
                .with_context(|| {
                    format!(
                        "TLS key {} does not go with the certificate {}",
                        key.display(),
                        cert.display()
                    )
                })?
        }
    })
}

/// The certificates of the PEM file `path` as authorities to trust; `what` names the file in
/// an error.
fn roots(path: &Path, what: &str) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut open(path, what)?) {
        let c = c.with_context(|| format!("{what} {}: not PEM", path.display()))?;
        roots
            .add(c)
            .with_context(|| format!("{what} {}", path.display()))?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "{what} {}: no certificate in it",
        path.display()
    );
    Ok(roots)
}

/// The certificate chain of `cert` and the private key of `key`.
fn chain_and_key(
    cert: &Path,
    key: &Path,
) -> anyhow::Result<(
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
)> {
    let chain = rustls_pemfile::certs(&mut open(cert, "TLS certificate")?)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("TLS certificate {}: not PEM", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "TLS certificate {}: no certificate in it",
        cert.display()
    );
    let private = rustls_pemfile::private_key(&mut open(key, "TLS key")?)
        .with_context(|| format!("TLS key {}: not PEM", key.display()))?
        .with_context(|| format!("TLS key {}: no private key in it", key.display()))?;
    Ok((chain, private))
}
