//! The in-network cache: which keys are cached, their values, and the rules that make them
//! servable, kept coherent with writes.
//!
//! - **Detection.** Every read the switch or proxy routes is shown to [`Cache::see`]: a
//!   time-segmented top-k tracker per backend ([`hot::Tracker`], SwitchKV's periodic reports)
//!   and a circular log ([`hot::CircularLog`], its instant reports) nominate hot keys.
//! - **Admission and eviction** ([`Admission`]). A nominated key enters while there is room;
//!   when full, only if its load is above a low percentile of the cached keys' loads, and then
//!   the least loaded unpinned key leaves. Cached keys' loads use the tracker's metric (an EWMA
//!   of requests per second, equation (1) of SwitchKV). Two other policies admit every key
//!   read: one evicts the least loaded, the other the least frequently used (IncBricks 4.2.1).
//! - **Rules.** A key is answered from the cache only once its rule is installed; entering and
//!   leaving are rule changes queued in a [`RuleBuffer`] and released under a [`RuleBudget`],
//!   additions first. A stale rule (its key already gone) only costs a forwarded miss.
//! - **Coherence.** A write invalidates the key's value before it is forwarded and opens a
//!   write on the key's coherence slot, closed when its reply passes (or it is given up). A
//!   reply fills only if no write to its slot began or ended since its GET was forwarded and
//!   none is open ([`FillToken`]). Values carry a lease that bounds how long a write that
//!   bypasses kvswitch can leave a stale value.
//!
//! Pure: the caller passes the time in and reads no clock; nothing here does I/O.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::expiry::Expiries;

use crate::time::Instant;

use crate::hot::{self, CircularLog, Tracker, TrackerConfig, TrackerError};
use crate::rules::{Change, RuleBudget, RuleBuffer, RuleConfig, RuleConfigError};

/// The cache's settings. [`Config::default`] gives the values of the papers where they have
/// one and sizes that suit one switch.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Most keys cached at once (SwitchKV's experiments use 10,000).
    pub items: usize,
    /// Most value bytes held at once.
    pub bytes: u64,
    /// Largest value cached; larger ones are always fetched from their server.
    pub max_value: usize,
    /// How long a filled value may be served before it must be fetched again.
    pub lease: Duration,
    /// The admission threshold's rank among the cached keys' loads, as a percentile from the
    /// lowest (SwitchKV: the 10th).
    pub admit_percentile: f64,
    /// The periodic top-k tracker (segment, top k, EWMA weight, sampling).
    pub tracker: TrackerConfig,
    /// Length of the circular log of recent reads (0: no instant reports).
    pub log_size: usize,
    /// A key seen more than this many times in the log is admitted at once.
    pub log_threshold: u32,
    /// The rule-update budget and the rule buffer's deletion delay.
    pub rules: RuleConfig,
    /// Which keys enter, and which leave a full cache first.
    pub admission: Admission,
    /// Number of coherence slots keys are hashed to (a power of two). Keys that share a slot
    /// only share refused fills, never a stale read.
    pub slots: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            items: 10_000,
            bytes: 64 << 20,
            max_value: 1 << 20,
            lease: Duration::from_secs(2),
            admit_percentile: 10.0,
            tracker: TrackerConfig::default(),
            log_size: 200,
            log_threshold: 8,
            rules: RuleConfig::default(),
            admission: Admission::Hot,
            slots: 1 << 16,
        }
    }
}

impl Config {
    /// Checks the settings; the error says which one is wrong and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.items == 0 {
            return Err(ConfigError::ZeroItems);
        }
        if self.bytes == 0 {
            return Err(ConfigError::ZeroBytes);
        }
        if self.lease.is_zero() {
            return Err(ConfigError::ZeroLease);
        }
        if !(0.0..=100.0).contains(&self.admit_percentile) {
            return Err(ConfigError::AdmitPercentile(self.admit_percentile));
        }
        if self.log_size > 0 && self.log_threshold == 0 {
            return Err(ConfigError::ZeroLogThreshold);
        }
        if !self.slots.is_power_of_two() {
            return Err(ConfigError::Slots(self.slots));
        }
        self.tracker.validate().map_err(ConfigError::Tracker)?;
        self.rules.validate().map_err(ConfigError::Rules)?;
        Ok(())
    }
}

/// Which keys the cache admits, and which it evicts first when full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Only the keys hot-key detection nominates, above the admission threshold; the least
    /// loaded leaves (SwitchKV).
    #[default]
    Hot,
    /// Every key read; the least loaded leaves. The traditional policy SwitchKV compares
    /// with, and a way to warm a cache that should hold a whole keyspace.
    EveryRead,
    /// Every key read; the one read least often since it entered leaves, the older of equals
    /// first (IncBricks' fixed-size LFU cache, section 4.2.1).
    Lfu,
}

impl Admission {
    /// Whether every key read is admitted (no detection, no threshold).
    pub fn every_read(self) -> bool {
        self != Admission::Hot
    }
}

/// A [`Config`] that is refused: which setting, and the value when that is what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("items must be at least 1")]
    ZeroItems,
    #[error("bytes must be at least 1")]
    ZeroBytes,
    #[error("lease must be longer than 0")]
    ZeroLease,
    /// The percentile given, outside 0..=100 (or NaN).
    #[error("admit_percentile must lie in 0..=100, not {0}")]
    AdmitPercentile(f64),
    #[error("log_threshold must be at least 1")]
    ZeroLogThreshold,
    /// The slot count given, not a power of two.
    #[error("slots must be a power of two, not {0}")]
    Slots(usize),
    #[error("tracker: {0}")]
    Tracker(TrackerError),
    #[error("rules: {0}")]
    Rules(RuleConfigError),
}

/// Why [`Cache::pin`] could not put a key in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// The cache is full and every key in it is pinned.
    #[error("all {cached} cached keys are pinned; unpin or evict one first")]
    AllPinned { cached: usize },
    /// The key's rule cannot be queued until the rule buffer drains.
    #[error("the rule buffer is full; try again later")]
    RuleBufferFull,
}

/// A cached value: what a retrieval reply shows of a memcached item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    pub flags: u32,
    /// The CAS unique the server returned with the value, if the reply carried one.
    pub cas: Option<u64>,
    pub data: Box<[u8]>,
    /// Whether the server stored the key base64-encoded (meta `b`), when a reply showed it:
    /// memcached echoes a key in the form it was stored in.
    pub key_base64: Option<bool>,
}

#[derive(Debug)]
struct Filled {
    value: Value,
    lease_end: Instant,
}

#[derive(Debug)]
struct Entry {
    value: Option<Filled>,
    /// Requests per second, as the tracker measures loads.
    load: f64,
    /// Reads seen in the current segment.
    reads: u64,
    /// Reads since it entered (the LFU policy's count).
    uses: u64,
    /// When it entered, in the cache's count of admissions (the LFU policy's tie-break).
    since: u64,
    pinned: bool,
    /// Whether the key's rule is installed: only then is the value served.
    rule: bool,
}

impl Entry {
    fn new(load: f64, pinned: bool) -> Entry {
        Entry {
            value: None,
            load,
            reads: 0,
            uses: 0,
            since: 0,
            pinned,
            rule: false,
        }
    }

    fn bytes(&self) -> u64 {
        self.value.as_ref().map_or(0, |f| f.value.data.len() as u64)
    }
}

/// A key's coherence state: bumped at every write's start and end.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    epoch: u64,
    writes: u32,
}

/// Taken when a read of a cached key is forwarded; its reply may fill only with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillToken {
    slot: u32,
    epoch: u64,
    all_epoch: u64,
}

/// Taken when a write is forwarded; give it back with [`Cache::end_write`] once its reply has
/// passed, or it is given up. `slot == None` is a flush of every key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTicket {
    slot: Option<u32>,
}

/// What happened to a value, for a copy of the values kept elsewhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueChange {
    /// The key has a new value ([`Cache::peek`] gives it and its lease).
    Filled(Box<[u8]>),
    /// The key's value is gone, or a write to it is about to be forwarded.
    Dropped(Box<[u8]>),
    /// Every value is gone (`flush_all`).
    DroppedAll,
}

/// What became of a fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    Filled,
    /// The key left the cache since its read was forwarded.
    NotCached,
    /// A write to the key began or ended since the read was forwarded, or is still open.
    WriteRaced,
    /// The value is larger than `max_value` or than the byte capacity allows.
    TooLarge,
    /// The item has expired in memcached by now, or may have (see [`Cache::note_expiry`]).
    Expired,
}

pub use crate::expiry::{WriteExpiry, UNKNOWN_EXPIRY};

/// Why a read of a cached key was not answered from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    NotCached,
    /// Admitted, but its rule is not installed yet.
    NoRule,
    /// Admitted, but no value (never filled, invalidated by a write).
    Empty,
    /// The value's lease ran out.
    LeaseExpired,
    /// The request asks for a CAS and the value came without one.
    NoCas,
}

/// Counters an operator asks about; they only grow.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub fills: u64,
    pub fills_refused: u64,
    pub admissions: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub lease_expiries: u64,
    pub rule_installs: u64,
    pub rule_removals: u64,
    pub instant_reports: u64,
    pub periodic_reports: u64,
    /// Rule changes the buffer could not take (it was full); the key was not admitted.
    pub rule_buffer_full: u64,
    /// Admissions refused because a second's worth of rule installs (under the rule budget)
    /// was already waiting: the key would wait longer for its rule than its load is worth.
    pub rule_backlog: u64,
}

/// A snapshot of the cache's size and rule state.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Gauges {
    pub entries: usize,
    pub filled: usize,
    pub bytes: u64,
    pub rules_installed: usize,
    /// Deletions held back in the rule buffer.
    pub buffered_removals: usize,
    /// Additions waiting for the budget.
    pub pending_installs: usize,
    pub threshold: f64,
}

/// One cached key, for the status API.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryInfo {
    pub key: Box<[u8]>,
    pub load: f64,
    pub bytes: u64,
    pub filled: bool,
    pub rule: bool,
    pub pinned: bool,
}

/// The cache. See the module documentation.
#[derive(Debug)]
pub struct Cache {
    cfg: Config,
    /// The cached keys. Nothing depends on the map's order: a scan of it sums, counts, or
    /// picks a minimum whose ties go to the lowest key ([`victim_order`]).
    entries: HashMap<Box<[u8]>, Entry>,
    bytes: u64,
    slots: Box<[Slot]>,
    /// The slot of every key at once: flushes.
    all: Slot,
    tracker: Tracker,
    log: Option<CircularLog>,
    buffer: RuleBuffer<Box<[u8]>>,
    budget: RuleBudget,
    /// The keys whose rules are installed now (a switch's table mirrors this set).
    installed: HashSet<Box<[u8]>>,
    /// Rule changes released and not yet taken by [`Cache::take_rule_changes`].
    released: Vec<Change<Box<[u8]>>>,
    /// Keep released changes for a switch to mirror (false: only the cache's own view).
    keep_released: bool,
    /// What happened to values since [`Cache::take_value_changes`], kept only for a copy of
    /// the values held elsewhere (see [`Cache::keep_value_changes`]).
    value_changes: Option<Vec<ValueChange>>,
    threshold: f64,
    /// Reads in the current segment and the rate of the last one, for instant reports' loads.
    segment_reads: u64,
    last_rate: f64,
    counters: Counters,
    /// What writes said of their keys' expiry.
    expiries: Expiries,
}

impl Cache {
    /// Makes room for `groups` backends (one added at run time) in hot-key detection.
    pub fn ensure_groups(&mut self, groups: usize) {
        self.tracker.ensure_groups(groups);
    }

    /// A cache for `groups` backends (the tracker keeps a top-k list per backend).
    pub fn new(cfg: Config, groups: usize, now: Instant) -> Result<Cache, ConfigError> {
        cfg.validate()?;
        let tracker =
            Tracker::new(cfg.tracker.clone(), groups.max(1), now).map_err(ConfigError::Tracker)?;
        let log = tracker.log_beside(cfg.log_size, cfg.log_threshold);
        let buffer = RuleBuffer::new(&cfg.rules).map_err(ConfigError::Rules)?;
        let budget = RuleBudget::from_config(&cfg.rules, now).map_err(ConfigError::Rules)?;
        Ok(Cache {
            slots: vec![Slot::default(); cfg.slots].into_boxed_slice(),
            cfg,
            entries: HashMap::new(),
            bytes: 0,
            all: Slot::default(),
            tracker,
            log,
            buffer,
            budget,
            installed: HashSet::new(),
            released: Vec::new(),
            keep_released: false,
            value_changes: None,
            threshold: 0.0,
            segment_reads: 0,
            last_rate: 0.0,
            counters: Counters::default(),
            expiries: Expiries::default(),
        })
    }

    /// Takes in what a write to `key` forwarded at `now` says of its item's expiry, so that no
    /// value is served past the time memcached drops the item: a fill's lease ends by then
    /// (a second early, as memcached's clock moves in seconds), and once it passed the key
    /// fills nothing until a write says otherwise. A write whose expiry is uncertain (an
    /// `add` that may not store) keeps the earlier of the two times for serving and the later
    /// for refusing fills. Bounded by [`crate::expiry::MAX_EXPIRIES`]: when full, every key without a record
    /// fills nothing until the latest expiry it could not note.
    pub fn note_expiry(&mut self, key: &[u8], expiry: WriteExpiry, now: Instant) {
        self.expiries.note(key, expiry, now);
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Keep released rule changes for [`Cache::take_rule_changes`] (a switch mirrors them into
    /// its table); without it they only change the cache's own view of the rules.
    pub fn keep_rule_changes(&mut self, keep: bool) {
        self.keep_released = keep;
    }

    /// Keep what happens to values for [`Cache::take_value_changes`]: a copy of the values
    /// held elsewhere (the XDP fast path's) follows them, dropping a key before any write to
    /// it is forwarded.
    pub fn keep_value_changes(&mut self, keep: bool) {
        self.value_changes = keep.then(Vec::new);
    }

    /// The value changes since the last call, in order (empty unless kept).
    pub fn take_value_changes(&mut self) -> Vec<ValueChange> {
        self.value_changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn value_changed(&mut self, change: ValueChange) {
        if let Some(changes) = &mut self.value_changes {
            changes.push(change);
        }
    }

    /// The value of `key` and the end of its lease while it is filled and its lease runs,
    /// counting nothing. Unlike [`Cache::lookup`] it does not ask for the key's rule: a copy
    /// kept elsewhere may answer before the rule is installed, as the value is right.
    pub fn peek(&self, key: &[u8], now: Instant) -> Option<(&Value, Instant)> {
        let filled = self.entries.get(key)?.value.as_ref()?;
        (now < filled.lease_end).then_some((&filled.value, filled.lease_end))
    }

    /// Counts `n` reads answered from a copy of the values held elsewhere as hits.
    pub fn count_hits(&mut self, n: u64) {
        self.counters.hits += n;
    }

    fn slot_of(&self, key: &[u8]) -> usize {
        // FNV-1a: cheap and well spread over the low bits used as the index.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in key {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h as usize) & (self.slots.len() - 1)
    }

    // ---- detection and admission ------------------------------------------------------------

    /// Counts one read of `key`, routed to backend `group`, and admits the keys this nominates.
    /// Also rolls the tracker's segment when it is due.
    pub fn see(&mut self, group: usize, key: &[u8], now: Instant) {
        self.roll(now);
        self.segment_reads += 1;
        if let Some(entry) = self.entries.get_mut(key) {
            entry.reads += 1;
            entry.uses += 1;
        }
        // One fingerprint for the tracker and the log, which share their fingerprints.
        let fp = self.tracker.fingerprints().of(key);
        self.tracker.see_fingerprint(group, key, fp, now);
        if self.cfg.admission.every_read() && !self.entries.contains_key(key) {
            if self.offer(key, self.threshold, now) {
                if let Some(entry) = self.entries.get_mut(key) {
                    entry.uses = 1;
                }
            }
            return;
        }
        let burst = self.log.as_mut().is_some_and(|log| log.see_fingerprint(fp));
        if burst && !self.entries.contains_key(key) {
            self.counters.instant_reports += 1;
            // The key's share of the log, times the read rate of the last segment.
            let share = f64::from(self.cfg.log_threshold + 1) / self.cfg.log_size as f64;
            let load = (share * self.last_rate).max(self.threshold);
            self.offer_instant(key, load, now);
        }
    }

    /// Ends the tracker's segment when it is due: cached keys' loads are updated with the same
    /// EWMA, the admission threshold is recomputed, and the new top-k reports are offered.
    pub fn roll(&mut self, now: Instant) {
        if !self.tracker.roll_if_due(now) {
            return;
        }
        let seconds = self.cfg.tracker.segment.as_secs_f64();
        let alpha = self.cfg.tracker.alpha;
        let scale = 1.0 / seconds;
        self.last_rate = self.segment_reads as f64 * scale;
        self.segment_reads = 0;
        for entry in self.entries.values_mut() {
            entry.load = hot::ewma(alpha, entry.reads as f64 * scale, entry.load);
            entry.reads = 0;
        }
        // The percentile is a value of the multiset of loads: the order collected is moot.
        let mut loads: Vec<f64> = self.entries.values().map(|e| e.load).collect();
        self.threshold =
            hot::admission_threshold(&mut loads, self.cfg.admit_percentile).unwrap_or(0.0);
        // Offered in the tracker's order (backend by backend, each in decreasing load), which
        // decides who is left out when the cache fills up.
        for report in self.tracker.take_reports() {
            if !self.entries.contains_key(&*report.key) {
                self.counters.periodic_reports += 1;
                self.offer(&report.key, report.load, now);
            }
        }
    }

    /// Admits `key` with `load` if there is room, or if it beats the admission threshold and
    /// the least loaded unpinned key, which then leaves. Returns whether it is cached now.
    pub fn offer(&mut self, key: &[u8], load: f64, now: Instant) -> bool {
        self.offer_as(key, load, now, false)
    }

    /// As [`Cache::offer`], for a key an instant report found bursting: taken even while a
    /// second's worth of installs waits, and its install goes ahead of them. Periodic reports
    /// may keep the rule budget busy for good; a burst must not wait behind them, and a
    /// circular log reports a key once, when it crosses its threshold.
    pub fn offer_instant(&mut self, key: &[u8], load: f64, now: Instant) -> bool {
        self.offer_as(key, load, now, true)
    }

    fn offer_as(&mut self, key: &[u8], load: f64, now: Instant, instant: bool) -> bool {
        if self.entries.contains_key(key) {
            return true;
        }
        // Under a rule budget, no more installs waiting than a second's worth: reports come
        // hottest first, so the hottest get the rules, and a backlog cannot grow while the
        // keys that wait in it cool down.
        if let (Some(rate), false) = (self.cfg.rules.rate, instant) {
            if self.buffer.len_adds() >= rate.max(1) as usize && !self.cfg.admission.every_read() {
                self.counters.rule_backlog += 1;
                return false;
            }
        }
        if self.entries.len() >= self.cfg.items {
            let every = self.cfg.admission.every_read();
            if load <= self.threshold && !every {
                return false;
            }
            match self.least_loaded() {
                Some((victim, victim_load)) if victim_load < load || every => {
                    // Its removal is queued before the new key's addition, and released at
                    // the admission's poll, after it: additions first.
                    self.remove_entry(&victim, now);
                }
                _ => return false,
            }
        }
        self.admit(key, Entry::new(load, false), now, instant)
    }

    fn admit(&mut self, key: &[u8], entry: Entry, now: Instant, first: bool) -> bool {
        let key: Box<[u8]> = key.into();
        let queued = if first {
            self.buffer.add_first(key.clone(), now)
        } else {
            self.buffer.add(key.clone(), now)
        };
        if queued.is_err() {
            self.counters.rule_buffer_full += 1;
            return false;
        }
        self.counters.admissions += 1;
        let mut entry = entry;
        entry.since = self.counters.admissions;
        // A deletion still buffered for this key was cancelled: its rule stays installed.
        entry.rule = self.installed.contains(&key);
        self.entries.insert(key, entry);
        self.poll_rules(now);
        true
    }

    /// The unpinned key that leaves first under the policy ([`victim_order`]), so that the
    /// victim never depends on the map's iteration order.
    fn least_loaded(&self) -> Option<(Box<[u8]>, f64)> {
        let policy = self.cfg.admission;
        self.entries
            .iter()
            .filter(|(_, e)| !e.pinned)
            .min_by(|(ka, a), (kb, b)| victim_order(policy, (ka, a), (kb, b)))
            .map(|(k, e)| (k.clone(), e.load))
    }

    fn evict_key(&mut self, key: &[u8], now: Instant) -> bool {
        let removed = self.remove_entry(key, now);
        self.poll_rules(now);
        removed
    }

    /// Drops `key` and queues its rule's removal, without releasing anything.
    fn remove_entry(&mut self, key: &[u8], now: Instant) -> bool {
        let Some(entry) = self.entries.remove(key) else {
            return false;
        };
        self.value_changed(ValueChange::Dropped(key.into()));
        self.bytes -= entry.bytes();
        self.counters.evictions += 1;
        if self.buffer.remove(key.into(), now).is_err() {
            // The buffer is full: the rule stays until a later removal; a stale rule only
            // costs forwarded misses.
            self.counters.rule_buffer_full += 1;
        }
        true
    }

    /// Puts `key` in the cache and keeps it there until [`Cache::unpin`] or
    /// [`Cache::evict`]. When the cache is full, the least loaded unpinned key leaves; fails
    /// only if every cached key is pinned or the rule buffer is full.
    pub fn pin(&mut self, key: &[u8], now: Instant) -> Result<(), PinError> {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.pinned = true;
            return Ok(());
        }
        if self.entries.len() >= self.cfg.items {
            let Some((victim, _)) = self.least_loaded() else {
                return Err(PinError::AllPinned {
                    cached: self.entries.len(),
                });
            };
            self.remove_entry(&victim, now);
        }
        let load = self.threshold;
        if self.admit(key, Entry::new(load, true), now, false) {
            Ok(())
        } else {
            Err(PinError::RuleBufferFull)
        }
    }

    /// Lets a pinned key be evicted again like any other. Returns whether it was cached.
    pub fn unpin(&mut self, key: &[u8]) -> bool {
        match self.entries.get_mut(key) {
            Some(entry) => {
                entry.pinned = false;
                true
            }
            None => false,
        }
    }

    /// Removes `key`, pinned or not. Returns whether it was cached.
    pub fn evict(&mut self, key: &[u8], now: Instant) -> bool {
        self.evict_key(key, now)
    }

    // ---- rules ------------------------------------------------------------------------------

    /// The earliest instant at which the periodic work has something to do: the origin (at
    /// once) while released rule changes wait for [`Cache::take_rule_changes`] (an admission
    /// while a read was seen releases its rule at once, and the switch's table only follows at
    /// a tick); else the end of the tracker's segment ([`Cache::roll`]), or when the rule
    /// budget next allows a queued change ([`Cache::poll_rules`]; the origin when it allows one
    /// already). Leases need no call: a lookup checks them against its own instant.
    pub fn poll_at(&self) -> Instant {
        if !self.released.is_empty() {
            return Instant::ZERO;
        }
        let segment = self.tracker.segment_end();
        if self.buffer.is_empty() {
            return segment;
        }
        segment.min(self.budget.ready_at().unwrap_or(Instant::ZERO))
    }

    /// Releases the rule changes the budget allows now; call it periodically (the switch does
    /// at every tick) so that deletions held back are released within their delay.
    pub fn poll_rules(&mut self, now: Instant) {
        for change in self.buffer.poll(now, &mut self.budget) {
            match &change {
                Change::Add(key) => {
                    self.counters.rule_installs += 1;
                    self.installed.insert(key.clone());
                    if let Some(entry) = self.entries.get_mut(key) {
                        entry.rule = true;
                    }
                }
                Change::Remove(key) => {
                    self.counters.rule_removals += 1;
                    self.installed.remove(key);
                    if let Some(entry) = self.entries.get_mut(key) {
                        entry.rule = false;
                    }
                }
            }
            if self.keep_released {
                self.released.push(change);
            }
        }
    }

    /// The rule changes released since the last call, in order, for a switch to apply to its
    /// table. Empty unless [`Cache::keep_rule_changes`] was set.
    pub fn take_rule_changes(&mut self) -> Vec<Change<Box<[u8]>>> {
        std::mem::take(&mut self.released)
    }

    // ---- serving and filling ----------------------------------------------------------------

    /// The value of `key` if it may be served now: cached, rule installed, filled, lease
    /// valid, and with a CAS when `want_cas`. Counts a hit or a miss of a cached key; reads
    /// of keys that are not cached count as misses too.
    pub fn lookup(&mut self, key: &[u8], want_cas: bool, now: Instant) -> Result<&Value, Miss> {
        let outcome = self.check(key, want_cas, now);
        match outcome {
            Ok(()) => {
                self.counters.hits += 1;
                let entry = self.entries.get(key).and_then(|e| e.value.as_ref());
                entry.map(|f| &f.value).ok_or(Miss::Empty)
            }
            Err(miss) => {
                self.counters.misses += 1;
                Err(miss)
            }
        }
    }

    /// Whether [`Cache::lookup`] would serve `key` now, counting nothing: a read that must be
    /// answered whole asks this of every key first.
    pub fn can_serve(&mut self, key: &[u8], want_cas: bool, now: Instant) -> bool {
        self.check(key, want_cas, now).is_ok()
    }

    /// Counts `n` reads of keys that were not answered from the cache.
    pub fn count_misses(&mut self, n: u64) {
        self.counters.misses += n;
    }

    fn check(&mut self, key: &[u8], want_cas: bool, now: Instant) -> Result<(), Miss> {
        let Some(entry) = self.entries.get_mut(key) else {
            return Err(Miss::NotCached);
        };
        if !entry.rule {
            return Err(Miss::NoRule);
        }
        let Some(filled) = &entry.value else {
            return Err(Miss::Empty);
        };
        if now >= filled.lease_end {
            let freed = filled.value.data.len() as u64;
            entry.value = None;
            self.bytes -= freed;
            self.counters.lease_expiries += 1;
            return Err(Miss::LeaseExpired);
        }
        if want_cas && filled.value.cas.is_none() {
            return Err(Miss::NoCas);
        }
        Ok(())
    }

    /// Raises a cached key's load to `load` if it is lower: what a report from elsewhere saw
    /// of it (a SwitchKV backend still reads a cached key until its rule is installed, and the
    /// cache node, which counts only the reads steered to it, would otherwise see it cool
    /// down before it is served). Returns whether the key is cached.
    pub fn raise_load(&mut self, key: &[u8], load: f64) -> bool {
        match self.entries.get_mut(key) {
            Some(entry) => {
                if load.is_finite() && load > entry.load {
                    entry.load = load;
                }
                true
            }
            None => false,
        }
    }

    /// Whether `key` is cached (admitted), whatever its value's state.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.entries.contains_key(key)
    }

    /// A token for filling `key` from the reply to a read being forwarded now; `None` if the
    /// key is not cached (its reply then fills nothing).
    pub fn fill_token(&self, key: &[u8]) -> Option<FillToken> {
        if !self.entries.contains_key(key) {
            return None;
        }
        let slot = self.slot_of(key);
        Some(FillToken {
            slot: slot as u32,
            epoch: self.slots[slot].epoch,
            all_epoch: self.all.epoch,
        })
    }

    /// Stores `value` for `key` from the reply to a read forwarded with `token`, if no write
    /// to the key began or ended since and none is open.
    pub fn fill(&mut self, key: &[u8], token: FillToken, value: Value, now: Instant) -> Fill {
        let outcome = self.try_fill(key, token, value, now);
        if outcome == Fill::Filled {
            self.counters.fills += 1;
        } else {
            self.counters.fills_refused += 1;
        }
        outcome
    }

    fn try_fill(&mut self, key: &[u8], token: FillToken, value: Value, now: Instant) -> Fill {
        let slot = self
            .slots
            .get(token.slot as usize)
            .copied()
            .unwrap_or_default();
        let raced = slot.epoch != token.epoch
            || slot.writes > 0
            || self.all.epoch != token.all_epoch
            || self.all.writes > 0
            || self.slot_of(key) != token.slot as usize;
        if raced {
            return Fill::WriteRaced;
        }
        let size = value.data.len() as u64;
        if value.data.len() > self.cfg.max_value || size > self.cfg.bytes {
            return Fill::TooLarge;
        }
        let Ok(cap) = self.expiries.cap(key, now) else {
            return Fill::Expired;
        };
        let Some(entry) = self.entries.get(key) else {
            return Fill::NotCached;
        };
        let (load, uses) = (entry.load, entry.uses);
        let old = entry.bytes();
        let policy = self.cfg.admission;
        // Whether a value ranks strictly below this one under the policy.
        let below = |e: &Entry| match policy {
            Admission::Lfu => e.uses < uses,
            Admission::Hot | Admission::EveryRead => e.load < load,
        };
        // Make room from values the policy ranks below this one, or give up.
        while self.bytes - old + size > self.cfg.bytes {
            // The first to leave, as in `least_loaded`.
            let victim = self
                .entries
                .iter()
                .filter(|(k, e)| e.value.is_some() && !e.pinned && &***k != key)
                .min_by(|(ka, a), (kb, b)| victim_order(policy, (ka, a), (kb, b)))
                .map(|(k, e)| (k.clone(), below(e)));
            match victim {
                Some((victim, true)) => self.evict_key(&victim, now),
                _ => return Fill::TooLarge,
            };
        }
        let lease_end = match cap {
            Some(cap) => cap.min(now + self.cfg.lease),
            None => now + self.cfg.lease,
        };
        let Some(entry) = self.entries.get_mut(key) else {
            return Fill::NotCached;
        };
        entry.value = Some(Filled { value, lease_end });
        self.bytes = self.bytes - old + size;
        self.value_changed(ValueChange::Filled(key.into()));
        Fill::Filled
    }

    // ---- coherence --------------------------------------------------------------------------

    /// Called before a write to `key` is forwarded: drops its value and opens a write on its
    /// slot, so that no read forwarded before the write's reply fills.
    pub fn begin_write(&mut self, key: &[u8]) -> WriteTicket {
        // Whether cached or not: a copy elsewhere may hold it still.
        self.value_changed(ValueChange::Dropped(key.into()));
        let slot = self.slot_of(key);
        let s = &mut self.slots[slot];
        s.epoch += 1;
        s.writes += 1;
        if let Some(entry) = self.entries.get_mut(key) {
            if let Some(filled) = entry.value.take() {
                self.bytes -= filled.value.data.len() as u64;
                self.counters.invalidations += 1;
            }
        }
        WriteTicket {
            slot: Some(slot as u32),
        }
    }

    /// Called before a write to every key (`flush_all`) is forwarded: drops every value.
    pub fn begin_flush(&mut self) -> WriteTicket {
        self.value_changed(ValueChange::DroppedAll);
        self.all.epoch += 1;
        self.all.writes += 1;
        for entry in self.entries.values_mut() {
            if entry.value.take().is_some() {
                self.counters.invalidations += 1;
            }
        }
        self.bytes = 0;
        WriteTicket { slot: None }
    }

    /// Closes a write: its reply has passed (before the client sees it), or it was given up
    /// (failed, timed out, or never answered).
    pub fn end_write(&mut self, ticket: WriteTicket) {
        let s = match ticket.slot {
            Some(slot) => match self.slots.get_mut(slot as usize) {
                Some(s) => s,
                None => return,
            },
            None => &mut self.all,
        };
        s.epoch += 1;
        s.writes = s.writes.saturating_sub(1);
    }

    // ---- what an operator sees --------------------------------------------------------------

    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn gauges(&self) -> Gauges {
        Gauges {
            entries: self.entries.len(),
            filled: self.entries.values().filter(|e| e.value.is_some()).count(),
            bytes: self.bytes,
            rules_installed: self.installed.len(),
            buffered_removals: self.buffer.len_removes(),
            pending_installs: self.buffer.len_adds(),
            threshold: self.threshold,
        }
    }

    /// The `limit` most loaded cached keys, most loaded first.
    pub fn top_entries(&self, limit: usize) -> Vec<EntryInfo> {
        let mut all: Vec<EntryInfo> = self
            .entries
            .iter()
            .map(|(k, e)| EntryInfo {
                key: k.clone(),
                load: e.load,
                bytes: e.bytes(),
                filled: e.value.is_some(),
                rule: e.rule,
                pinned: e.pinned,
            })
            .collect();
        all.sort_by(|a, b| b.load.total_cmp(&a.load).then_with(|| a.key.cmp(&b.key)));
        all.truncate(limit);
        all
    }

    /// The hot keys the tracker reports now: key, load and backend.
    pub fn hot_keys(&self) -> Vec<(Box<[u8]>, f64, usize)> {
        let mut hot: Vec<_> = self
            .tracker
            .hot()
            .map(|(k, load, group)| (Box::<[u8]>::from(k), load, group))
            .collect();
        // Equal loads: by backend, then key.
        hot.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| a.2.cmp(&b.2))
                .then_with(|| a.0.cmp(&b.0))
        });
        hot
    }
}

/// The order in which cached keys leave: lower load first (under LFU: fewer reads since they
/// entered, then the older), and among equals the lower key in byte order. Loads compare by
/// [`f64::total_cmp`], so a NaN never makes the order partial.
fn victim_order(policy: Admission, a: (&[u8], &Entry), b: (&[u8], &Entry)) -> std::cmp::Ordering {
    let first = match policy {
        Admission::Lfu => a.1.uses.cmp(&b.1.uses).then(a.1.since.cmp(&b.1.since)),
        Admission::Hot | Admission::EveryRead => a.1.load.total_cmp(&b.1.load),
    };
    first.then_with(|| a.0.cmp(b.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(data: &[u8], cas: Option<u64>) -> Value {
        Value {
            flags: 7,
            cas,
            data: data.into(),
            key_base64: None,
        }
    }

    fn cache(items: usize, rate: Option<u32>) -> (Cache, Instant) {
        let now = Instant::ZERO;
        let mut cfg = Config {
            items,
            ..Config::default()
        };
        cfg.rules.rate = rate;
        (Cache::new(cfg, 1, now).unwrap(), now)
    }

    /// Admits and fills `key` so that it is served.
    fn cached(c: &mut Cache, key: &[u8], now: Instant) {
        assert!(c.offer(key, 100.0, now));
        let token = c.fill_token(key).unwrap();
        assert_eq!(c.fill(key, token, value(b"v", Some(1)), now), Fill::Filled);
    }

    #[test]
    fn a_filled_key_is_served_until_its_lease_ends() {
        let (mut c, now) = cache(10, None);
        assert_eq!(c.lookup(b"k", false, now).unwrap_err(), Miss::NotCached);
        assert!(c.offer(b"k", 1.0, now));
        assert_eq!(c.lookup(b"k", false, now).unwrap_err(), Miss::Empty);
        let token = c.fill_token(b"k").unwrap();
        assert_eq!(c.fill(b"k", token, value(b"abc", None), now), Fill::Filled);
        assert_eq!(&*c.lookup(b"k", false, now).unwrap().data, b"abc");
        // No CAS came with the value: a request for one is not answered.
        assert_eq!(c.lookup(b"k", true, now).unwrap_err(), Miss::NoCas);
        let later = now + c.config().lease;
        assert_eq!(
            c.lookup(b"k", false, later).unwrap_err(),
            Miss::LeaseExpired
        );
        assert_eq!(c.gauges().bytes, 0);
        let n = c.counters();
        assert_eq!((n.hits, n.fills, n.lease_expiries), (1, 1, 1));
    }

    #[test]
    fn a_value_is_never_served_past_the_expiry_its_write_gave() {
        let now = Instant::ZERO;
        let cfg = Config {
            items: 10,
            lease: Duration::from_secs(60),
            ..Config::default()
        };
        let mut c = Cache::new(cfg, 1, now).unwrap();
        assert!(c.offer(b"k", 1.0, now));
        let fill = |c: &mut Cache, at: Instant| {
            let token = c.fill_token(b"k").unwrap();
            c.fill(b"k", token, value(b"v", None), at)
        };
        let sets = |secs: u64, definite: bool| WriteExpiry::Sets {
            after: Some(Duration::from_secs(secs)),
            definite,
        };
        // `set k 0 3`: served for two seconds at most (memcached's clock moves in seconds).
        c.note_expiry(b"k", sets(3, true), now);
        assert_eq!(fill(&mut c, now), Fill::Filled);
        let (_, until) = c.peek(b"k", now).unwrap();
        assert_eq!(until, now + Duration::from_secs(2));
        assert!(c.lookup(b"k", false, until).is_err());
        // Past it, nothing fills.
        assert_eq!(fill(&mut c, until), Fill::Expired);
        // An exptime of 1 second, or an absolute time: never served.
        c.note_expiry(b"k", sets(1, true), until);
        assert_eq!(fill(&mut c, until), Fill::Expired);
        c.note_expiry(b"k", sets(UNKNOWN_EXPIRY.as_secs(), true), until);
        assert_eq!(fill(&mut c, until), Fill::Expired);
        // A set that never expires lifts it; the lease alone bounds the value again.
        let t = until + Duration::from_secs(1);
        c.note_expiry(
            b"k",
            WriteExpiry::Sets {
                after: None,
                definite: true,
            },
            t,
        );
        assert_eq!(fill(&mut c, t), Fill::Filled);
        assert_eq!(c.peek(b"k", t).unwrap().1, t + c.config().lease);
        // An add that may not have stored keeps the earlier time to serve by.
        c.note_expiry(b"k", sets(10, true), t);
        c.note_expiry(b"k", sets(100, false), t);
        assert_eq!(fill(&mut c, t), Fill::Filled);
        assert_eq!(c.peek(b"k", t).unwrap().1, t + Duration::from_secs(9));
        // Writes that keep the expiry change nothing.
        c.note_expiry(b"k", WriteExpiry::Unchanged, t);
        assert_eq!(fill(&mut c, t), Fill::Filled);
        assert_eq!(c.peek(b"k", t).unwrap().1, t + Duration::from_secs(9));
    }

    #[test]
    fn value_changes_name_every_fill_and_drop_in_order_a_write_first() {
        let (mut c, now) = cache(10, None);
        assert!(c.take_value_changes().is_empty(), "not kept until asked");
        c.keep_value_changes(true);
        cached(&mut c, b"k", now);
        let token = c.fill_token(b"k").unwrap();
        assert_eq!(c.fill(b"k", token, value(b"v", None), now), Fill::Filled);
        let (v, until) = c.peek(b"k", now).expect("filled, lease running");
        assert_eq!(&*v.data, b"v");
        assert!(c.peek(b"k", until).is_none(), "not after its lease");
        // A write to a key the cache does not hold is named too: a copy may hold it.
        let w = c.begin_write(b"other");
        c.end_write(w);
        let w = c.begin_write(b"k");
        c.end_write(w);
        let f = c.begin_flush();
        c.end_write(f);
        assert_eq!(
            c.take_value_changes(),
            vec![
                // `cached` filled it once already.
                ValueChange::Filled(b"k".as_slice().into()),
                ValueChange::Filled(b"k".as_slice().into()),
                ValueChange::Dropped(b"other".as_slice().into()),
                ValueChange::Dropped(b"k".as_slice().into()),
                ValueChange::DroppedAll,
            ]
        );
        assert!(c.evict(b"k", now));
        assert_eq!(
            c.take_value_changes(),
            vec![ValueChange::Dropped(b"k".as_slice().into())]
        );
    }

    #[test]
    fn a_write_refuses_every_fill_whose_read_it_may_have_overtaken() {
        let (mut c, now) = cache(10, None);
        cached(&mut c, b"k", now);
        // Read forwarded before the write: refused.
        let before = c.fill_token(b"k").unwrap();
        let w = c.begin_write(b"k");
        assert_eq!(c.lookup(b"k", false, now).unwrap_err(), Miss::Empty);
        // Read forwarded while the write is open: refused, also after the write closed.
        let during = c.fill_token(b"k").unwrap();
        assert_eq!(
            c.fill(b"k", during, value(b"old", None), now),
            Fill::WriteRaced
        );
        c.end_write(w);
        assert_eq!(
            c.fill(b"k", before, value(b"old", None), now),
            Fill::WriteRaced
        );
        assert_eq!(
            c.fill(b"k", during, value(b"old", None), now),
            Fill::WriteRaced
        );
        // Read forwarded after the write's reply passed: fills.
        let after = c.fill_token(b"k").unwrap();
        assert_eq!(c.fill(b"k", after, value(b"new", None), now), Fill::Filled);
        assert_eq!(&*c.lookup(b"k", false, now).unwrap().data, b"new");
        assert_eq!(c.counters().invalidations, 1);
    }

    #[test]
    fn overlapping_writes_keep_fills_out_until_the_last_closes() {
        let (mut c, now) = cache(10, None);
        cached(&mut c, b"k", now);
        let w1 = c.begin_write(b"k");
        let w2 = c.begin_write(b"k");
        c.end_write(w1);
        let token = c.fill_token(b"k").unwrap();
        assert_eq!(
            c.fill(b"k", token, value(b"x", None), now),
            Fill::WriteRaced
        );
        c.end_write(w2);
        let token = c.fill_token(b"k").unwrap();
        assert_eq!(c.fill(b"k", token, value(b"x", None), now), Fill::Filled);
    }

    #[test]
    fn a_flush_empties_the_cache_and_races_every_fill() {
        let (mut c, now) = cache(10, None);
        cached(&mut c, b"a", now);
        cached(&mut c, b"b", now);
        let token = c.fill_token(b"a").unwrap();
        let flush = c.begin_flush();
        assert_eq!(c.lookup(b"b", false, now).unwrap_err(), Miss::Empty);
        c.end_write(flush);
        assert_eq!(
            c.fill(b"a", token, value(b"x", None), now),
            Fill::WriteRaced
        );
        assert_eq!(c.gauges().filled, 0);
        assert_eq!(c.gauges().entries, 2);
    }

    #[test]
    fn a_full_cache_admits_only_above_the_threshold_and_evicts_the_least_loaded() {
        let (mut c, now) = cache(10, None);
        for i in 0..10u32 {
            assert!(c.offer(format!("k{i}").as_bytes(), f64::from(i + 1) * 10.0, now));
        }
        // Loads 10..=100; the 10th percentile is the lowest load.
        c.threshold = 10.0;
        assert!(!c.offer(b"cold", 5.0, now));
        assert!(!c.offer(b"tie", 10.0, now));
        assert!(c.offer(b"hot", 55.0, now));
        assert!(!c.contains(b"k0"), "the least loaded key leaves");
        assert!(c.contains(b"hot"));
        assert_eq!(c.gauges().entries, 10);
        assert_eq!(c.counters().evictions, 1);
        // Pinned keys never leave.
        c.pin(b"k1", now).unwrap();
        assert!(c.offer(b"hotter", 60.0, now));
        assert!(c.contains(b"k1"));
        assert!(!c.contains(b"k2"));
    }

    #[test]
    fn refused_settings_name_the_setting() {
        let refused = |change: fn(&mut Config)| {
            let mut cfg = Config::default();
            change(&mut cfg);
            let e = Cache::new(cfg, 1, Instant::ZERO).unwrap_err();
            (e.clone(), e.to_string())
        };
        assert_eq!(
            refused(|c| c.items = 0),
            (ConfigError::ZeroItems, "items must be at least 1".into())
        );
        assert_eq!(
            refused(|c| c.admit_percentile = 101.0),
            (
                ConfigError::AdmitPercentile(101.0),
                "admit_percentile must lie in 0..=100, not 101".into()
            )
        );
        assert_eq!(
            refused(|c| c.slots = 3),
            (
                ConfigError::Slots(3),
                "slots must be a power of two, not 3".into()
            )
        );
        assert_eq!(
            refused(|c| c.rules.rate = Some(0)),
            (
                ConfigError::Rules(RuleConfigError::ZeroRate),
                "rules: rule update rate must be at least 1 per second".into()
            )
        );
        assert_eq!(
            refused(|c| c.tracker.sample = 0).0,
            ConfigError::Tracker(TrackerError::ZeroSample)
        );
    }

    #[test]
    fn pinning_a_full_cache_of_pinned_keys_fails() {
        let (mut c, now) = cache(2, None);
        c.pin(b"a", now).unwrap();
        c.pin(b"b", now).unwrap();
        let e = c.pin(b"c", now).unwrap_err();
        assert_eq!(e, PinError::AllPinned { cached: 2 });
        assert_eq!(
            e.to_string(),
            "all 2 cached keys are pinned; unpin or evict one first"
        );
        assert!(!c.contains(b"c"));
    }

    #[test]
    fn a_key_is_served_only_once_its_rule_is_installed() {
        // One rule per second: the second key waits a second for its rule.
        let (mut c, now) = cache(10, Some(1));
        cached(&mut c, b"a", now);
        assert!(c.lookup(b"a", false, now).is_ok());
        assert!(c.offer(b"b", 1.0, now));
        let token = c.fill_token(b"b").unwrap();
        c.fill(b"b", token, value(b"v", None), now);
        assert_eq!(c.lookup(b"b", false, now).unwrap_err(), Miss::NoRule);
        assert_eq!(c.gauges().pending_installs, 1);
        let later = now + Duration::from_millis(1100);
        c.poll_rules(later);
        assert!(c.lookup(b"b", false, later).is_ok());
        assert_eq!(c.gauges().rules_installed, 2);
    }

    #[test]
    fn byte_capacity_evicts_less_loaded_values_or_refuses() {
        let now = Instant::ZERO;
        let cfg = Config {
            bytes: 10,
            ..Config::default()
        };
        let mut c = Cache::new(cfg, 1, now).unwrap();
        c.offer(b"cold", 1.0, now);
        c.offer(b"hot", 100.0, now);
        let t = c.fill_token(b"cold").unwrap();
        assert_eq!(c.fill(b"cold", t, value(&[1; 6], None), now), Fill::Filled);
        let t = c.fill_token(b"hot").unwrap();
        assert_eq!(c.fill(b"hot", t, value(&[2; 6], None), now), Fill::Filled);
        assert!(!c.contains(b"cold"));
        assert_eq!(c.gauges().bytes, 6);
        c.offer(b"warm", 50.0, now);
        let t = c.fill_token(b"warm").unwrap();
        assert_eq!(
            c.fill(b"warm", t, value(&[3; 6], None), now),
            Fill::TooLarge
        );
        let t = c.fill_token(b"warm").unwrap();
        assert_eq!(
            c.fill(b"warm", t, value(&[3; 11], None), now),
            Fill::TooLarge
        );
    }

    #[test]
    fn admitting_every_read_fills_a_whole_keyspace_and_evicts_the_least_loaded() {
        let now = Instant::ZERO;
        let cfg = Config {
            items: 3,
            admission: Admission::EveryRead,
            ..Config::default()
        };
        let mut c = Cache::new(cfg, 1, now).unwrap();
        for key in [&b"a"[..], b"b", b"c"] {
            c.see(0, key, now);
            assert!(c.contains(key));
        }
        c.entries.get_mut(&b"b"[..]).unwrap().load = -1.0;
        c.see(0, b"d", now);
        assert!(c.contains(b"d") && !c.contains(b"b"));
        assert_eq!(c.gauges().entries, 3);
    }

    #[test]
    fn lfu_evicts_the_least_read_since_admission_and_the_older_of_equals() {
        let now = Instant::ZERO;
        let lfu = |items| Config {
            items,
            admission: Admission::Lfu,
            ..Config::default()
        };
        let mut c = Cache::new(lfu(2), 1, now).unwrap();
        for _ in 0..5 {
            c.see(0, b"a", now);
        }
        c.see(0, b"b", now);
        // b was read once, a five times: b leaves, though a is the lower key and both loads
        // are the same until the segment rolls.
        c.see(0, b"c", now);
        assert!(c.contains(b"a") && c.contains(b"c") && !c.contains(b"b"));
        // Counts keep growing: c read twice still leaves before a read five times.
        c.see(0, b"c", now);
        c.see(0, b"d", now);
        assert!(c.contains(b"d") && !c.contains(b"c"), "c had 2 reads, a 5");
        c.see(0, b"d", now);
        c.see(0, b"e", now);
        assert!(!c.contains(b"d") && c.contains(b"a"), "d had 2 reads, a 5");

        // Equal counts: the older leaves first, whatever the keys' order.
        let mut c = Cache::new(lfu(2), 1, now).unwrap();
        c.see(0, b"z", now);
        c.see(0, b"y", now);
        c.see(0, b"x", now);
        assert!(!c.contains(b"z") && c.contains(b"y") && c.contains(b"x"));

        // The same cache under the load policy evicts by load and key: a, the lower key.
        let mut c = Cache::new(
            Config {
                items: 2,
                admission: Admission::EveryRead,
                ..Config::default()
            },
            1,
            now,
        )
        .unwrap();
        for _ in 0..5 {
            c.see(0, b"a", now);
        }
        c.see(0, b"b", now);
        c.see(0, b"c", now);
        assert!(!c.contains(b"a"));
    }

    #[test]
    fn equal_loads_evict_the_lowest_key() {
        let now = Instant::ZERO;
        let cfg = Config {
            items: 3,
            admission: Admission::EveryRead,
            ..Config::default()
        };
        let mut c = Cache::new(cfg, 1, now).unwrap();
        // Every key enters at the threshold, 0: all loads are equal.
        for key in [&b"m"[..], b"b", b"x"] {
            c.see(0, key, now);
        }
        c.see(0, b"d", now);
        assert!(!c.contains(b"b") && c.contains(b"d"));
        c.see(0, b"a", now);
        assert!(!c.contains(b"d"), "d is now the lowest of d, m, x");
        for key in [&b"a"[..], b"m", b"x"] {
            assert!(c.contains(key));
        }

        // Making room for a value: the same order among values of equal load.
        let cfg = Config {
            bytes: 10,
            ..Config::default()
        };
        let mut c = Cache::new(cfg, 1, now).unwrap();
        for (key, load) in [(&b"k2"[..], 1.0), (b"k1", 1.0), (b"k3", 1.0), (b"hot", 5.0)] {
            c.offer(key, load, now);
        }
        for key in [&b"k2"[..], b"k1", b"k3"] {
            let t = c.fill_token(key).unwrap();
            let outcome = c.fill(key, t, value(&[0; 3], None), now);
            assert_eq!(outcome, Fill::Filled);
        }
        let t = c.fill_token(b"hot").unwrap();
        assert_eq!(c.fill(b"hot", t, value(&[1; 3], None), now), Fill::Filled);
        assert!(!c.contains(b"k1"));
        assert!(c.contains(b"k2") && c.contains(b"k3"));
    }

    #[test]
    fn released_rule_changes_make_the_cache_due_at_once() {
        let (mut c, now) = cache(10, None);
        c.keep_rule_changes(true);
        let segment_end = now + c.config().tracker.segment;
        assert_eq!(c.poll_at(), segment_end);
        assert!(c.offer(b"k", 1.0, now));
        // The rule is released already; a switch mirrors it at its next tick.
        assert_eq!(c.poll_at(), Instant::ZERO);
        assert_eq!(c.take_rule_changes(), [Change::Add(Box::from(&b"k"[..]))]);
        assert_eq!(c.poll_at(), segment_end);
    }

    #[test]
    fn a_limited_rule_budget_is_due_when_it_allows_the_next_change() {
        // One rule a second: the first goes at once, the second waits a second for its rule.
        let (mut c, now) = cache(10, Some(1));
        assert!(c.offer(b"a", 1.0, now));
        assert!(c.offer(b"b", 1.0, now));
        assert_eq!(c.gauges().pending_installs, 1);
        let due = c.poll_at();
        assert_eq!(due, now + Duration::from_secs(1));
        c.poll_rules(due - Duration::from_nanos(1));
        assert_eq!(c.gauges().pending_installs, 1, "not a nanosecond early");
        c.poll_rules(due);
        assert_eq!(c.gauges().pending_installs, 0);
        assert_eq!(c.poll_at(), now + c.config().tracker.segment);
    }

    #[test]
    fn the_circular_log_admits_a_burst_at_once() {
        let (mut c, now) = cache(10, None);
        for _ in 0..8 {
            c.see(0, b"burst", now);
        }
        assert!(!c.contains(b"burst"));
        c.see(0, b"burst", now);
        assert!(
            c.contains(b"burst"),
            "seen more than 8 times in the last 200 reads"
        );
        assert_eq!(c.counters().instant_reports, 1);
    }

    #[test]
    fn the_periodic_tracker_admits_each_backends_top_keys_after_a_segment() {
        let now = Instant::ZERO;
        let cfg = Config {
            log_size: 0,
            ..Config::default()
        };
        let mut c = Cache::new(cfg, 2, now).unwrap();
        for i in 0..20u32 {
            for _ in 0..=i {
                c.see((i % 2) as usize, format!("k{i}").as_bytes(), now);
            }
        }
        assert_eq!(c.gauges().entries, 0);
        c.roll(now + Duration::from_secs(1));
        // The top 5 of each backend: k19, k17, ..., k11 and k18, k16, ..., k10.
        assert_eq!(c.gauges().entries, 10);
        for i in 10..20 {
            assert!(c.contains(format!("k{i}").as_bytes()), "k{i}");
        }
        assert_eq!(c.counters().periodic_reports, 10);
    }
}
