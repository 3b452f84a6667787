//! The one cache that the switch's UDP path and the proxy's TCP path share: what each path asks
//! of it around a request (answer it, take fill tokens, open and close writes) on top of the
//! pure [`kv::cache::Cache`], behind one lock. Replies are built byte for byte as memcached
//! builds them ([`wire::memcache::cached`]).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kv::Instant;

pub use kv::cache::WriteExpiry;
use kv::cache::{Cache, FillToken, Value, ValueChange, WriteTicket};
use wire::memcache::cached::{self, CachedItem, KeyForm};
use wire::memcache::{binary, Command, Request, MAX_KEY_LEN};

/// How long an unanswered write (a lost UDP reply, a `noreply` write) keeps the switch from
/// filling its key, by default.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The cache's settings, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSettings {
    pub enabled: bool,
    pub cache: kv::cache::Config,
    /// How long the switch waits for a write's UDP reply before it stops expecting one.
    pub write_timeout: Duration,
}

impl Default for CacheSettings {
    fn default() -> CacheSettings {
        CacheSettings {
            enabled: false,
            cache: kv::cache::Config::default(),
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }
}

/// Why the cache's settings were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cache: {0}")]
pub struct CacheError(pub kv::cache::ConfigError);

/// A copy of the cache's answers kept elsewhere (the XDP fast path's, which answers `get` of
/// one key in the kernel). Called with the cache's lock held, in the cache's own order: a key
/// is dropped before any write to it is forwarded, on whichever path.
pub trait CacheMirror: Send + Sync {
    /// `key` may be answered with `reply` (the whole text reply to `get KEY`) until `until`.
    fn fill(&self, key: &[u8], reply: &[u8], until: Instant);
    /// `key` may no longer be answered.
    fn drop_key(&self, key: &[u8]);
    /// No key may be answered.
    fn drop_all(&self);
}

/// The cache, locked: see [`CacheService::lock`].
pub struct CacheGuard<'a> {
    service: &'a CacheService,
    cache: Option<MutexGuard<'a, Cache>>,
}

impl std::ops::Deref for CacheGuard<'_> {
    type Target = Cache;
    fn deref(&self) -> &Cache {
        self.cache.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for CacheGuard<'_> {
    fn deref_mut(&mut self) -> &mut Cache {
        self.cache.as_mut().expect("held until dropped")
    }
}

impl Drop for CacheGuard<'_> {
    fn drop(&mut self) {
        if let Some(mut cache) = self.cache.take() {
            self.service.mirror_changes(&mut cache);
        }
    }
}

/// The shared cache.
pub struct CacheService {
    inner: Mutex<Cache>,
    settings: CacheSettings,
    /// Set once, when a fast path attaches; only then does the cache keep value changes.
    mirror: OnceLock<Arc<dyn CacheMirror>>,
}

impl std::fmt::Debug for CacheService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheService")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What the cache answers of a read.
#[derive(Debug)]
pub enum Served {
    /// The whole reply.
    All(Vec<u8>),
    /// A text multi-get's cached keys: `hits` marks them in key order, `cached` is their
    /// `VALUE` items in that order and `END`.
    Some {
        hits: Vec<bool>,
        cached: Vec<u8>,
    },
    None,
}

/// Fill tokens taken when a read of cached keys was forwarded; its reply fills with them.
#[derive(Debug)]
pub struct ReadFill {
    /// The request, kept to read its reply.
    request: Vec<u8>,
    tokens: Vec<(Box<[u8]>, FillToken)>,
}

/// A fill token for one key, taken when a read of it was forwarded (a protocol whose replies
/// the caller reads itself: Redis's `GET`).
#[derive(Debug)]
pub struct KeyFill {
    key: Box<[u8]>,
    token: FillToken,
}

/// The writes a forwarded request opened; close them once its reply has passed.
#[derive(Debug)]
pub struct Writes {
    tickets: Vec<WriteTicket>,
}

impl Writes {
    /// Joins the writes of another request of the same datagram.
    pub fn extend(&mut self, other: Writes) {
        self.tickets.extend(other.tickets);
    }
}

impl CacheService {
    /// A cache over `groups` backends.
    pub fn new(
        settings: CacheSettings,
        groups: usize,
        now: Instant,
    ) -> Result<Arc<Self>, CacheError> {
        let cache = Cache::new(settings.cache.clone(), groups, now).map_err(CacheError)?;
        Ok(Arc::new(CacheService {
            inner: Mutex::new(cache),
            settings,
            mirror: OnceLock::new(),
        }))
    }

    pub fn settings(&self) -> &CacheSettings {
        &self.settings
    }

    /// Keeps `mirror` in step with the cache's values from now on (see [`CacheMirror`]); the
    /// values cached before are not copied. A cache has one mirror: false, and nothing
    /// changed, when it has one already.
    pub fn set_mirror(&self, mirror: Arc<dyn CacheMirror>) -> bool {
        let mut cache = self.lock();
        let set = self.mirror.set(mirror).is_ok();
        if set {
            cache.keep_value_changes(true);
        }
        set
    }

    /// Counts `n` reads of one key answered by the mirror as the cache's hits.
    pub fn count_mirror_hits(&self, n: u64) {
        self.lock().count_hits(n);
    }

    /// Hands the value changes since the last call to the mirror, under the cache's lock.
    fn mirror_changes(&self, cache: &mut Cache) {
        let Some(mirror) = self.mirror.get() else {
            return;
        };
        for change in cache.take_value_changes() {
            match change {
                ValueChange::Filled(key) => match get_reply(cache, &key) {
                    Some((reply, until)) => mirror.fill(&key, &reply, until),
                    None => mirror.drop_key(&key),
                },
                ValueChange::Dropped(key) => mirror.drop_key(&key),
                ValueChange::DroppedAll => mirror.drop_all(),
            }
        }
    }

    /// The cache itself, for the status API, the switch's rule mirror and the subcommands.
    /// What the holder changed of its values reaches the mirror as the guard is dropped,
    /// before the lock is released.
    pub fn lock(&self) -> CacheGuard<'_> {
        // A panic while holding the lock leaves the cache consistent enough to serve: every
        // method finishes its bookkeeping before it can fail.
        CacheGuard {
            service: self,
            cache: Some(self.inner.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Shows the keys of a read to hot-key detection; `locate` names a key's backend.
    pub fn see(&self, request: &Request<'_>, locate: &mut dyn FnMut(&[u8]) -> usize, now: Instant) {
        if !request.command.is_retrieval() {
            return;
        }
        let mut cache = self.lock();
        let mut decoded = [0u8; MAX_KEY_LEN];
        for token in request.keys() {
            if let Ok(key) = request.stored_key(token, &mut decoded) {
                let group = locate(key);
                cache.see(group, key, now);
            }
        }
    }

    /// The reply to a read whose every key may be served from the cache now, built as
    /// memcached builds it; `None` if any key misses (the read is then forwarded whole).
    pub fn serve(&self, request: &Request<'_>, now: Instant) -> Option<Vec<u8>> {
        let serve = cached::servable(request)?;
        {
            // Every key must be servable, or none is answered (and none counted as a hit).
            let mut cache = self.lock();
            let mut decoded = [0u8; MAX_KEY_LEN];
            for token in request.keys() {
                let servable = request
                    .stored_key(token, &mut decoded)
                    .is_ok_and(|key| cache.can_serve(key, serve.want_cas, now));
                if !servable {
                    cache.count_misses(request.key_count() as u64);
                    return None;
                }
            }
        }
        match self.serve_parts(request, now) {
            Served::All(reply) => Some(reply),
            Served::Some { .. } | Served::None => None,
        }
    }

    /// The text reply to `get KEY` (or `gets KEY`) if the cache may answer it now: one
    /// `VALUE` item and `END`, as the key's server would send it.
    pub fn serve_text_key(&self, command: Command, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        let name: &[u8] = match command {
            Command::Get => b"get ",
            Command::Gets => b"gets ",
            _ => return None,
        };
        let bytes = [name, key, b"\r\n"].concat();
        let request = wire::memcache::parse_text(&bytes).ok()??;
        self.serve(&request, now)
    }

    /// What the cache can answer of a read now: all of it, the cached keys of a text
    /// multi-get (the rest goes to the servers), or nothing.
    pub fn serve_parts(&self, request: &Request<'_>, now: Instant) -> Served {
        let Some(serve) = cached::servable(request) else {
            return Served::None;
        };
        let mut cache = self.lock();
        let mut decoded = [0u8; MAX_KEY_LEN];
        let mut out = Vec::new();
        let mut hits = Vec::with_capacity(request.key_count());
        for token in request.keys() {
            let Ok(key) = request.stored_key(token, &mut decoded) else {
                return Served::None;
            };
            let hit = match cache.lookup(key, serve.want_cas, now) {
                Ok(value) => {
                    let item = CachedItem {
                        flags: value.flags,
                        cas: value.cas,
                        data: &value.data,
                        key_form: key_form(value.key_base64),
                    };
                    // A value that cannot answer this form (no CAS, a key echo in an unknown
                    // form) is a miss: its key goes to its server.
                    cached::write_hit(request, token, &item, &mut out)
                }
                Err(_) => false,
            };
            hits.push(hit);
        }
        let text = request.protocol == wire::memcache::Protocol::Text;
        if text {
            cached::write_text_end(&mut out);
        }
        if hits.iter().all(|&h| h) {
            return Served::All(out);
        }
        if text && serve.multi && hits.iter().any(|&h| h) {
            return Served::Some { hits, cached: out };
        }
        Served::None
    }

    /// Fill tokens for the cached keys of a read being forwarded now; `None` when it names none
    /// (or cannot fill at all).
    pub fn before_read(&self, request: &Request<'_>) -> Option<ReadFill> {
        self.before_read_except(request, &[])
    }

    /// As [`CacheService::before_read`], leaving out the keys `answered` marks (in key order):
    /// the cache answered them, and a value must never refill itself.
    pub fn before_read_except(&self, request: &Request<'_>, answered: &[bool]) -> Option<ReadFill> {
        cached::servable(request)?;
        let cache = self.lock();
        let mut decoded = [0u8; MAX_KEY_LEN];
        let mut tokens = Vec::new();
        for (i, token) in request.keys().enumerate() {
            if answered.get(i).copied().unwrap_or(false) {
                continue;
            }
            let Ok(key) = request.stored_key(token, &mut decoded) else {
                continue;
            };
            if let Some(fill) = cache.fill_token(key) {
                tokens.push((Box::<[u8]>::from(key), fill));
            }
        }
        if tokens.is_empty() {
            return None;
        }
        Some(ReadFill {
            request: request.bytes().to_vec(),
            tokens,
        })
    }

    /// Fills from the server's complete reply to a read forwarded with `fill`.
    pub fn after_read(&self, fill: ReadFill, reply: &[u8], now: Instant) {
        let Ok(Some(request)) = wire::memcache::parse(&fill.request) else {
            return;
        };
        let mut items = Vec::new();
        let mut decoded = [0u8; MAX_KEY_LEN];
        cached::read_fills(&request, reply, |token, item| {
            if let Ok(key) = request.stored_key(token, &mut decoded) {
                let form = key_base64(item.key_form);
                items.push((
                    Box::<[u8]>::from(key),
                    item.flags,
                    item.cas,
                    item.data,
                    form,
                ));
            }
        });
        if items.is_empty() {
            return;
        }
        let mut cache = self.lock();
        for (key, flags, cas, data, key_base64) in items {
            let Some((_, token)) = fill.tokens.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            let value = Value {
                flags,
                cas,
                data: data.into(),
                key_base64,
            };
            cache.fill(&key, *token, value, now);
        }
        // The guard hands the fills to the mirror as it is dropped.
    }

    /// Opens the writes of a request that changes items, before it is forwarded at `now`: its
    /// keys' values are dropped at once, and what it says of their expiry is noted (no value
    /// is then served past it). `None` for a request that writes nothing.
    pub fn before_write(&self, request: &Request<'_>, now: Instant) -> Option<Writes> {
        if !writes(request) {
            return None;
        }
        let expiry = write_expiry(request);
        let mut cache = self.lock();
        let tickets = if flushes(request) {
            vec![cache.begin_flush()]
        } else {
            let mut decoded = [0u8; MAX_KEY_LEN];
            let mut tickets = Vec::with_capacity(1);
            for token in request.keys() {
                if let Ok(key) = request.stored_key(token, &mut decoded) {
                    cache.note_expiry(key, expiry, now);
                    tickets.push(cache.begin_write(key));
                }
            }
            tickets
        };
        // Before the write is forwarded: no copy may answer for the keys it changes (the guard
        // drops them from the mirror as this returns).
        drop(cache);
        Some(Writes { tickets })
    }

    /// Closes the writes of a request whose reply has passed, or that was given up.
    pub fn after_write(&self, writes: Writes) {
        let mut cache = self.lock();
        for ticket in writes.tickets {
            cache.end_write(ticket);
        }
    }

    // ---- by key, for protocols other than memcached (Redis) ---------------------------------

    /// Shows a read of `key` to hot-key detection; `group` is its server.
    pub fn see_key(&self, group: usize, key: &[u8], now: Instant) {
        self.lock().see(group, key, now);
    }

    /// The value of `key` if it may be served now (a hit or a miss is counted).
    pub fn serve_key(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.lock()
            .lookup(key, false, now)
            .ok()
            .map(|v| v.data.to_vec())
    }

    /// A fill token for `key`, read now from its server; `None` when it is not cached.
    pub fn before_read_key(&self, key: &[u8]) -> Option<KeyFill> {
        let token = self.lock().fill_token(key)?;
        Some(KeyFill {
            key: key.into(),
            token,
        })
    }

    /// Fills `fill`'s key with `data`, the value its server answered.
    pub fn after_read_key(&self, fill: KeyFill, data: &[u8], now: Instant) {
        let value = Value {
            flags: 0,
            cas: None,
            data: data.into(),
            key_base64: None,
        };
        self.lock().fill(&fill.key, fill.token, value, now);
    }

    /// Opens writes to `keys` before a command that changes them is forwarded at `now`, with
    /// what it says of their expiry; their values are dropped at once.
    pub fn before_write_keys<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
        expiry: WriteExpiry,
        now: Instant,
    ) -> Writes {
        let mut cache = self.lock();
        let tickets = keys
            .into_iter()
            .map(|key| {
                cache.note_expiry(key, expiry, now);
                cache.begin_write(key)
            })
            .collect();
        drop(cache);
        Writes { tickets }
    }

    /// Opens a write to every key (a command whose keys the caller cannot name).
    pub fn before_flush(&self) -> Writes {
        let ticket = self.lock().begin_flush();
        Writes {
            tickets: vec![ticket],
        }
    }

    /// When [`CacheService::tick`] next has work (see [`Cache::poll_at`]).
    pub fn poll_at(&self) -> Option<Instant> {
        Some(self.lock().poll_at())
    }

    /// Periodic work: the tracker's segment and the rule buffer's delayed removals.
    pub fn tick(&self, now: Instant) {
        let mut cache = self.lock();
        cache.roll(now);
        cache.poll_rules(now);
    }
}

/// The text reply to `get KEY` from the filled value of `key`, and the end of its lease (which
/// the mirror keeps to: it is not checked here, as the guard that calls this has no clock).
fn get_reply(cache: &Cache, key: &[u8]) -> Option<(Vec<u8>, Instant)> {
    let (value, until) = cache.peek(key, Instant::ZERO)?;
    let bytes = [b"get ", key, b"\r\n"].concat();
    let request = wire::memcache::parse_text(&bytes).ok()??;
    let token = request.keys().next()?;
    let item = CachedItem {
        flags: value.flags,
        cas: value.cas,
        data: &value.data,
        key_form: key_form(value.key_base64),
    };
    let mut out = Vec::new();
    if !cached::write_hit(&request, token, &item, &mut out) {
        return None;
    }
    cached::write_text_end(&mut out);
    Some((out, until))
}

/// Whether a request may change stored items. A meta get that the cache cannot answer may carry
/// flags that change the item (`T`, `N`, `E`), so it counts as one: the cost is a dropped value.
fn writes(request: &Request<'_>) -> bool {
    match request.command {
        Command::MetaGet => cached::servable(request).is_none(),
        command => command.is_write(),
    }
}

/// Whether a request empties every server (`flush_all`, binary FLUSH).
fn flushes(request: &Request<'_>) -> bool {
    matches!(
        request.command,
        Command::FlushAll
            | Command::Binary(binary::opcode::FLUSH)
            | Command::Binary(binary::opcode::FLUSHQ)
    )
}

/// How a cached value's key was stored, as the reply builder needs it.
fn key_form(key_base64: Option<bool>) -> KeyForm {
    match key_base64 {
        None => KeyForm::Unknown,
        Some(false) => KeyForm::Raw,
        Some(true) => KeyForm::Base64,
    }
}

/// The other way: what a reply showed of the key's form, as the cache keeps it.
fn key_base64(form: KeyForm) -> Option<bool> {
    match form {
        KeyForm::Unknown => None,
        KeyForm::Raw => Some(false),
        KeyForm::Base64 => Some(true),
    }
}

/// What a write request says of its items' expiry, as memcached reads its exptime
/// ([`cached::expiry`]), for the caches that keep to it.
pub fn write_expiry(request: &Request<'_>) -> WriteExpiry {
    match cached::expiry(request) {
        cached::Expiry::Unchanged => WriteExpiry::Unchanged,
        cached::Expiry::Sets { after, definite } => WriteExpiry::Sets {
            after: after.map(|s| match s {
                cached::UNKNOWN_EXPIRY => kv::expiry::UNKNOWN_EXPIRY,
                s => Duration::from_secs(u64::from(s)),
            }),
            definite,
        },
    }
}
