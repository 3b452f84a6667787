//! Checks a recorded history of memcached operations for the coherence promise: no client reads
//! a value after a write that replaced it was acknowledged to any client.
//!
//! Pure: operations come in with their start and end times (nanoseconds from one origin the
//! recorder chose) and their outcomes; nothing here does I/O or reads a clock. The testbed's
//! `history_load` records histories against real servers.
//!
//! The model. Every key is absent at time 0 (a harness that stores something first records
//! that write). A write *W* takes effect at some instant between its start and its end. A read
//! *R* that returned value *v* must have read it from some write of *v* that began no later
//! than *R* ended, and that write must not have been replaced for certain before *R* began:
//! it is, when another write *W'* began after *W* ended and ended before *R* began (then *W'*
//! took effect after *W* and before *R*). Writes of one value may be several (every delete
//! writes "absent"); one of them justifying the read is enough. A write whose outcome is unknown
//! (a timeout, an error) may take effect at any time from its start on, or never: it may justify
//! a read but never replaces anything.
//!
//! Values are numbers (the harness writes decimal numbers, so that `incr` applies to them);
//! each set should write a value no other write produces, so that a read names its writer.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;

/// What a key holds: a number, or `None` for absent.
pub type Value = Option<u64>;

/// What an operation did, as far as the client could tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A `get` or `gets` that returned a value, or `None` for a miss.
    Read(Value),
    /// An acknowledged write: `set` (`STORED`), `cas` (`STORED`) and `incr` (the new number
    /// from the reply) write `Some`, `delete` (`DELETED`) writes `None`.
    Write(Value),
    /// A write with no answer or an error answer (timeout, `SERVER_ERROR`, lost connection):
    /// it may have taken effect at any time from its start on, or never.
    MaybeWrite(Value),
    /// An `incr` by this delta with no answer: it may have written an unknown number (a value
    /// the key could hold plus the delta) at any time from its start on, or nothing.
    MaybeIncr(u64),
    /// No effect and nothing observed: `NOT_STORED`, `EXISTS`, `NOT_FOUND`, a failed read.
    Failed,
}

/// One operation of one client on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: u32,
    /// The command, for messages: `get`, `gets`, `set`, `cas`, `incr`, `delete`.
    pub cmd: &'static str,
    pub key: String,
    /// When the request was about to be sent.
    pub start: u64,
    /// When its reply had been read (or the client gave up); not before `start`.
    pub end: u64,
    pub kind: Kind,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "client {} {} {:?} [{} .. {}] ns ",
            self.client, self.cmd, self.key, self.start, self.end
        )?;
        match self.kind {
            Kind::Read(v) => write!(f, "read {}", show(v)),
            Kind::Write(v) => write!(f, "wrote {}", show(v)),
            Kind::MaybeWrite(v) => write!(f, "may have written {}", show(v)),
            Kind::MaybeIncr(d) => write!(f, "may have added {d}"),
            Kind::Failed => write!(f, "failed"),
        }
    }
}

fn show(v: Value) -> String {
    v.map_or_else(|| "absent".to_string(), |n| n.to_string())
}

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The state at time 0: every key absent.
    Initial,
    Op(Op),
}

impl fmt::Display for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Writer::Initial => write!(f, "the initial state (absent)"),
            Writer::Op(op) => op.fmt(f),
        }
    }
}

/// A read the model cannot explain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// The read returned `writer`'s value although `overwrite` began after `writer` ended and
    /// ended before the read began. `writer` is the latest-ending write of the value that could
    /// have been read.
    Stale {
        read: Op,
        writer: Writer,
        overwrite: Op,
    },
    /// The read returned a value no write (certain or possible) produced.
    Unwritten { read: Op },
    /// The read returned a value only written by writes that began after it ended; `writer` is
    /// the earliest of them.
    Future { read: Op, writer: Op },
}

impl Violation {
    pub fn read(&self) -> &Op {
        match self {
            Violation::Stale { read, .. }
            | Violation::Unwritten { read }
            | Violation::Future { read, .. } => read,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Stale {
                read,
                writer,
                overwrite,
            } => write!(
                f,
                "stale read of {:?}: {read}\n  value from {writer}\n  overwritten by {overwrite}",
                read.key
            ),
            Violation::Unwritten { read } => {
                write!(f, "value no write produced, {:?}: {read}", read.key)
            }
            Violation::Future { read, writer } => write!(
                f,
                "value from the future, {:?}: {read}\n  only written by {writer}",
                read.key
            ),
        }
    }
}

/// Counts over a checked history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub ops: usize,
    pub keys: usize,
    /// Reads that returned an answer.
    pub reads: usize,
    /// Reads that returned a value (the rest of `reads` were misses).
    pub hits: usize,
    /// Acknowledged writes.
    pub writes: usize,
    /// Writes whose outcome is unknown.
    pub uncertain: usize,
    /// Operations with no effect.
    pub failed: usize,
    /// Hits on a value another client wrote.
    pub hits_from_others: usize,
    /// Hits explained only by an `incr` whose outcome is unknown.
    pub hits_via_uncertain_incr: usize,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ops on {} keys: {} reads ({} hits, {} of another client's value, {} via an \
             uncertain incr), {} writes, {} uncertain, {} failed",
            self.ops,
            self.keys,
            self.reads,
            self.hits,
            self.hits_from_others,
            self.hits_via_uncertain_incr,
            self.writes,
            self.uncertain,
            self.failed
        )
    }
}

/// The outcome of [`check`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub stats: Stats,
    /// In the order of the reads in the input.
    pub violations: Vec<Violation>,
    /// For each read that a recorded write explains (a hit, or a miss after a delete): (index of
    /// the read, index of that write) in the checked slice, ordered by the read. The write is
    /// the latest-ending one that could have been read.
    pub sources: Vec<(usize, usize)>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// The first `n` violations, one per line, for a failure message.
    pub fn first_violations(&self, n: usize) -> String {
        let shown: Vec<String> = self
            .violations
            .iter()
            .take(n)
            .map(ToString::to_string)
            .collect();
        shown.join("\n")
    }
}

/// Index of the virtual write of the initial state.
const INITIAL: usize = usize::MAX;
/// The largest sum of uncertain increments looked for between a read value and a recorded
/// write (the harness adds 1 to 9 at a time; writes' values are a million apart).
const MAX_INCR_SUM: u64 = 100_000;

/// The writes of one key, arranged so each read is checked with two binary searches.
#[derive(Default)]
struct KeyIndex {
    /// Acknowledged writes as (end, start, index), sorted by end.
    by_end: Vec<(u64, u64, usize)>,
    /// `prefix_start[i]`: the (start, index) with the latest start among `by_end[..=i]`.
    prefix_start: Vec<(u64, usize)>,
    /// Per value, its writes as (start, end, index) sorted by start; uncertain writes end at
    /// `u64::MAX`.
    by_value: HashMap<Value, Vec<(u64, u64, usize)>>,
    /// Per value, `prefix_end[i]`: the (end, index) with the latest end among the first i+1.
    prefix_end: HashMap<Value, Vec<(u64, usize)>>,
    /// Uncertain increments as (start, delta).
    maybe_incrs: Vec<(u64, u64)>,
    reads: Vec<usize>,
}

impl KeyIndex {
    fn finish(&mut self) {
        self.by_end.sort_unstable();
        let mut best = (0, INITIAL);
        self.prefix_start = self
            .by_end
            .iter()
            .map(|&(_, start, i)| {
                if best.1 == INITIAL || start > best.0 {
                    best = (start, i);
                }
                best
            })
            .collect();
        for (value, writes) in &mut self.by_value {
            writes.sort_unstable();
            let mut best = (0, INITIAL);
            let prefix = writes
                .iter()
                .enumerate()
                .map(|(n, &(_, end, i))| {
                    if n == 0 || end > best.0 {
                        best = (end, i);
                    }
                    best
                })
                .collect();
            self.prefix_end.insert(*value, prefix);
        }
    }

    /// The acknowledged write with the latest start among those that ended before `t`.
    fn latest_start_ending_before(&self, t: u64) -> Option<(u64, usize)> {
        let n = self.by_end.partition_point(|&(end, _, _)| end < t);
        n.checked_sub(1).map(|last| self.prefix_start[last])
    }

    /// The write of `value` with the latest end among those that began by `t`, as (end,
    /// index); `Err` with the earliest writer's index when every write began after `t`, or
    /// `Err(None)` when none wrote it.
    fn latest_writer_begun_by(&self, value: Value, t: u64) -> Result<(u64, usize), Option<usize>> {
        let Some(writes) = self.by_value.get(&value) else {
            return Err(None);
        };
        let n = writes.partition_point(|&(start, _, _)| start <= t);
        match n.checked_sub(1) {
            Some(last) => Ok(self.prefix_end[&value][last]),
            None => Err(writes.first().map(|w| w.2)),
        }
    }

    /// Whether `value` could have been produced, by `t`, by uncertain increments on top of a
    /// write that began by `t`: `value` less a write's value is a sum of some of the deltas of
    /// the uncertain increments begun by `t` (each taken at most once; any number of them, as
    /// when a replica that took them failed to answer).
    fn via_uncertain_incr(&self, value: u64, t: u64) -> bool {
        let deltas: Vec<u64> = self
            .maybe_incrs
            .iter()
            .filter(|&&(start, _)| start <= t)
            .map(|&(_, delta)| delta)
            .collect();
        let most = deltas
            .iter()
            .fold(0u64, |sum, d| sum.saturating_add(*d))
            .min(MAX_INCR_SUM);
        if most == 0 {
            return false;
        }
        // sums[s]: whether some of the deltas add up to s (a bounded subset sum).
        let mut sums = vec![false; most as usize + 1];
        sums[0] = true;
        for &d in &deltas {
            let d = d as usize;
            if d == 0 || d > most as usize {
                continue;
            }
            for s in (d..sums.len()).rev() {
                sums[s] |= sums[s - d];
            }
        }
        self.by_value.keys().any(|base| {
            base.is_some_and(|b| {
                b < value
                    && value - b <= most
                    && sums[(value - b) as usize]
                    && self.latest_writer_begun_by(Some(b), t).is_ok()
            })
        })
    }
}

/// Checks `ops` (in any order). The check is O(n log n): per key, acknowledged writes sorted
/// by end with the prefix maxima of their starts, and per value its writes sorted by start with
/// the prefix maxima of their ends.
///
/// Panics if an operation ends before it starts.
pub fn check(ops: &[Op]) -> Report {
    let mut keys: HashMap<&str, KeyIndex> = HashMap::new();
    let mut stats = Stats {
        ops: ops.len(),
        ..Stats::default()
    };
    for (i, op) in ops.iter().enumerate() {
        assert!(op.end >= op.start, "operation ends before it starts: {op}");
        let index = keys.entry(op.key.as_str()).or_insert_with(|| {
            let mut index = KeyIndex::default();
            index.by_value.insert(None, vec![(0, 0, INITIAL)]);
            index
        });
        match op.kind {
            Kind::Read(_) => {
                stats.reads += 1;
                index.reads.push(i);
            }
            Kind::Write(v) => {
                stats.writes += 1;
                index.by_end.push((op.end, op.start, i));
                index
                    .by_value
                    .entry(v)
                    .or_default()
                    .push((op.start, op.end, i));
            }
            Kind::MaybeWrite(v) => {
                stats.uncertain += 1;
                index
                    .by_value
                    .entry(v)
                    .or_default()
                    .push((op.start, u64::MAX, i));
            }
            Kind::MaybeIncr(delta) => {
                stats.uncertain += 1;
                index.maybe_incrs.push((op.start, delta));
            }
            Kind::Failed => stats.failed += 1,
        }
    }
    stats.keys = keys.len();

    let mut violations = Vec::new();
    let mut sources = Vec::new();
    for index in keys.values_mut() {
        index.finish();
        for &r in &index.reads {
            let read = &ops[r];
            let Kind::Read(value) = read.kind else {
                continue;
            };
            if value.is_some() {
                stats.hits += 1;
            }
            match index.latest_writer_begun_by(value, read.end) {
                Ok((end, w)) => {
                    if let Some((start, o)) = index.latest_start_ending_before(read.start) {
                        if start > end {
                            violations.push(Violation::Stale {
                                read: read.clone(),
                                writer: writer(ops, w),
                                overwrite: ops[o].clone(),
                            });
                            continue;
                        }
                    }
                    if w != INITIAL {
                        sources.push((r, w));
                        if value.is_some() && ops[w].client != read.client {
                            stats.hits_from_others += 1;
                        }
                    }
                }
                Err(earliest) => {
                    let explained = value.is_some_and(|v| index.via_uncertain_incr(v, read.end));
                    if explained {
                        stats.hits_via_uncertain_incr += 1;
                        continue;
                    }
                    violations.push(match earliest {
                        Some(w) => Violation::Future {
                            read: read.clone(),
                            writer: ops[w].clone(),
                        },
                        None => Violation::Unwritten { read: read.clone() },
                    });
                }
            }
        }
    }
    violations.sort_by(|a, b| {
        let key = |v: &Violation| (v.read().start, v.read().client, v.read().key.clone());
        key(a).cmp(&key(b))
    });
    sources.sort_unstable();
    Report {
        stats,
        violations,
        sources,
    }
}

fn writer(ops: &[Op], w: usize) -> Writer {
    if w == INITIAL {
        Writer::Initial
    } else {
        Writer::Op(ops[w].clone())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn op(client: u32, cmd: &'static str, start: u64, end: u64, kind: Kind) -> Op {
        Op {
            client,
            cmd,
            key: "k".to_string(),
            start,
            end,
            kind,
        }
    }
    fn set(client: u32, start: u64, end: u64, v: u64) -> Op {
        op(client, "set", start, end, Kind::Write(Some(v)))
    }
    fn get(client: u32, start: u64, end: u64, v: Value) -> Op {
        op(client, "get", start, end, Kind::Read(v))
    }
    fn delete(client: u32, start: u64, end: u64) -> Op {
        op(client, "delete", start, end, Kind::Write(None))
    }

    #[test]
    fn a_read_after_a_completed_overwrite_is_stale() {
        let ops = vec![
            set(1, 10, 20, 100),
            set(2, 30, 40, 200),
            // Begins after the second set was acknowledged, yet sees the first.
            get(3, 50, 60, Some(100)),
        ];
        let report = check(&ops);
        assert_eq!(
            report.violations,
            vec![Violation::Stale {
                read: ops[2].clone(),
                writer: Writer::Op(ops[0].clone()),
                overwrite: ops[1].clone(),
            }]
        );
        assert!(report.violations[0].to_string().starts_with("stale read"));
        assert_eq!(report.stats.reads, 1);
        assert_eq!(report.stats.hits, 1);
    }

    #[test]
    fn reads_that_overlap_the_overwrite_may_see_either_value() {
        let ops = vec![
            set(1, 10, 20, 100),
            set(2, 30, 40, 200),
            get(3, 35, 45, Some(100)),
            get(3, 39, 50, Some(200)),
            // Starts exactly when the overwrite ends: not strictly after it.
            get(4, 40, 50, Some(100)),
            get(4, 41, 50, Some(200)),
        ];
        let report = check(&ops);
        assert!(report.ok(), "{:?}", report.violations);
        assert_eq!(report.sources, vec![(2, 0), (3, 1), (4, 0), (5, 1)]);
        assert_eq!(report.stats.hits_from_others, 4);
    }

    #[test]
    fn concurrent_writes_leave_either_value() {
        // Two overlapping sets: neither began after the other ended, so either may be last.
        let ops = vec![
            set(1, 10, 30, 100),
            set(2, 20, 40, 200),
            get(3, 50, 60, Some(100)),
            get(4, 50, 60, Some(200)),
        ];
        assert!(check(&ops).ok());

        // A third set after both: now neither may be read.
        let mut more = ops.clone();
        more.push(set(5, 45, 48, 300));
        let report = check(&more);
        assert_eq!(report.violations.len(), 2);
        for v in &report.violations {
            let Violation::Stale { overwrite, .. } = v else {
                panic!("{v}");
            };
            assert_eq!(overwrite, &more[4]);
        }
    }

    #[test]
    fn a_read_before_the_overwrite_completes_is_not_stale() {
        let ops = vec![
            set(1, 10, 20, 100),
            set(2, 30, 60, 200),
            get(3, 40, 50, Some(100)),
            get(3, 55, 58, Some(200)),
        ];
        assert!(check(&ops).ok());
    }

    #[test]
    fn a_value_nobody_wrote_is_impossible() {
        let ops = vec![set(1, 10, 20, 100), get(2, 30, 40, Some(999))];
        let report = check(&ops);
        assert_eq!(
            report.violations,
            vec![Violation::Unwritten {
                read: ops[1].clone()
            }]
        );
    }

    #[test]
    fn a_value_written_only_after_the_read_is_impossible() {
        let ops = vec![get(2, 10, 20, Some(100)), set(1, 30, 40, 100)];
        let report = check(&ops);
        assert_eq!(
            report.violations,
            vec![Violation::Future {
                read: ops[0].clone(),
                writer: ops[1].clone(),
            }]
        );
        assert!(report.violations[0].to_string().contains("future"));

        // A failed set produces nothing: its value cannot be read.
        let ops = vec![
            op(1, "set", 10, 20, Kind::Failed),
            get(2, 30, 40, Some(100)),
        ];
        assert_eq!(check(&ops).violations.len(), 1);
    }

    #[test]
    fn absent_is_the_initial_state_and_what_deletes_write() {
        // Absent before any write, and while the first set runs.
        let ops = vec![
            get(1, 5, 8, None),
            set(2, 10, 20, 100),
            get(1, 15, 25, None),
        ];
        let report = check(&ops);
        assert!(report.ok(), "{:?}", report.violations);
        assert_eq!(report.stats.hits, 0);
        assert!(report.sources.is_empty());

        // Absent after a completed set and no delete: stale, from the initial state.
        let ops = vec![set(2, 10, 20, 100), get(1, 30, 40, None)];
        let report = check(&ops);
        assert_eq!(
            report.violations,
            vec![Violation::Stale {
                read: ops[1].clone(),
                writer: Writer::Initial,
                overwrite: ops[0].clone(),
            }]
        );

        // Absent after a set, with a delete concurrent with the read: fine.
        let ops = vec![
            set(2, 10, 20, 100),
            delete(3, 35, 50),
            get(1, 30, 40, None),
            get(1, 30, 40, Some(100)),
        ];
        assert!(check(&ops).ok());

        // Absent after a completed delete, then a completed set: stale again.
        let ops = vec![
            set(2, 10, 20, 100),
            delete(3, 25, 30),
            set(2, 35, 40, 200),
            get(1, 50, 60, None),
            get(1, 50, 60, Some(100)),
        ];
        let report = check(&ops);
        assert_eq!(report.violations.len(), 2, "{:?}", report.violations);
        assert!(matches!(
            &report.violations[0],
            Violation::Stale { writer: Writer::Op(w), overwrite, .. }
                if w == &ops[1] && overwrite == &ops[2]
        ));
    }

    #[test]
    fn incr_results_are_writes() {
        let ops = vec![
            set(1, 10, 20, 1000),
            op(2, "incr", 30, 40, Kind::Write(Some(1005))),
            get(3, 35, 45, Some(1000)),
            get(3, 50, 60, Some(1005)),
            // After the incr was acknowledged the set's value is gone.
            get(4, 50, 60, Some(1000)),
        ];
        let report = check(&ops);
        assert_eq!(report.violations.len(), 1);
        assert_eq!(report.violations[0].read(), &ops[4]);
    }

    #[test]
    fn uncertain_writes_may_appear_later_but_never_replace() {
        let ops = vec![
            set(1, 10, 20, 100),
            // Timed out: may land at any time from 30 on, or never.
            op(2, "set", 30, 40, Kind::MaybeWrite(Some(200))),
            get(3, 50, 60, Some(100)),
            get(3, 1_000, 1_010, Some(200)),
            get(3, 1_020, 1_030, Some(100)),
            op(2, "delete", 1_100, 1_200, Kind::MaybeWrite(None)),
            get(3, 5_000, 5_010, None),
            get(3, 5_020, 5_030, Some(100)),
        ];
        let report = check(&ops);
        assert!(report.ok(), "{:?}", report.violations);
        assert_eq!(report.stats.uncertain, 2);

        // It may not be read before it began.
        let ops = vec![
            get(3, 5, 8, Some(200)),
            op(2, "set", 30, 40, Kind::MaybeWrite(Some(200))),
        ];
        assert!(matches!(
            check(&ops).violations.as_slice(),
            [Violation::Future { .. }]
        ));

        // A failed op changes nothing: the earlier value stays readable and is still replaced
        // by an acknowledged write.
        let ops = vec![
            set(1, 10, 20, 100),
            op(2, "cas", 30, 40, Kind::Failed),
            get(3, 50, 60, Some(100)),
            set(1, 70, 80, 300),
            get(3, 90, 95, Some(100)),
        ];
        let report = check(&ops);
        assert_eq!(report.violations.len(), 1);
        assert_eq!(report.violations[0].read(), &ops[4]);
        assert_eq!(report.stats.failed, 1);
    }

    #[test]
    fn uncertain_incrs_explain_unknown_numbers() {
        let ops = vec![
            set(1, 10, 20, 1000),
            op(2, "incr", 30, 40, Kind::MaybeIncr(7)),
            op(2, "incr", 50, 60, Kind::MaybeIncr(2)),
            get(3, 70, 80, Some(1007)),
            get(3, 70, 80, Some(1009)),
            // 1000 + 3 is nothing the increments could make.
            get(3, 70, 80, Some(1003)),
            // Not before the increment began.
            get(3, 22, 25, Some(1007)),
        ];
        let report = check(&ops);
        let bad: Vec<&Op> = report.violations.iter().map(Violation::read).collect();
        assert_eq!(bad, vec![&ops[6], &ops[5]]);
        assert_eq!(report.stats.hits_via_uncertain_incr, 2);
    }

    #[test]
    fn any_number_of_uncertain_incrs_may_stand_between_a_write_and_a_read() {
        // As when a replica that took them failed to answer: each applied, each uncertain.
        let mut ops = vec![set(1, 10, 20, 1000)];
        for (i, delta) in [1u64, 2, 3, 4, 5, 6].into_iter().enumerate() {
            let at = 30 + 10 * i as u64;
            ops.push(op(2, "incr", at, at + 5, Kind::MaybeIncr(delta)));
        }
        ops.push(get(3, 100, 110, Some(1021)));
        ops.push(get(3, 100, 110, Some(1020)));
        // More than they all add up to.
        ops.push(get(3, 100, 110, Some(1022)));
        let report = check(&ops);
        let bad: Vec<&Op> = report.violations.iter().map(Violation::read).collect();
        assert_eq!(bad, vec![&ops[9]]);
        assert_eq!(report.stats.hits_via_uncertain_incr, 2);
    }

    #[test]
    fn keys_are_independent() {
        let mut other = set(1, 30, 40, 200);
        other.key = "other".to_string();
        let ops = vec![set(1, 10, 20, 100), other, get(3, 50, 60, Some(100))];
        let report = check(&ops);
        assert!(report.ok());
        assert_eq!(report.stats.keys, 2);
    }

    #[test]
    #[should_panic(expected = "ends before it starts")]
    fn an_op_ending_before_it_starts_is_refused() {
        check(&[get(1, 20, 10, None)]);
    }

    /// 200,000 operations on 16 keys from 32 clients, each a sequence of non-overlapping
    /// operations, reads returning the latest completed write; three stale reads planted.
    #[test]
    fn large_histories_check_quickly() {
        let mut ops = Vec::new();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // A sequential history: one op at a time, each 10 ns long, 10 ns apart.
        let mut latest: HashMap<String, Value> = HashMap::new();
        let mut t = 1;
        for n in 0..200_000u64 {
            let key = format!("k{}", rand() % 16);
            let client = (rand() % 32) as u32;
            let (kind, cmd) = match rand() % 4 {
                0 => (Kind::Write(Some(n)), "set"),
                1 => (Kind::Write(None), "delete"),
                _ => {
                    let v = latest.get(&key).copied().flatten();
                    (Kind::Read(v), "get")
                }
            };
            if let Kind::Write(v) = kind {
                latest.insert(key.clone(), v);
            }
            ops.push(Op {
                client,
                cmd,
                key,
                start: t,
                end: t + 10,
                kind,
            });
            t += 20;
        }
        // Plant stale reads: a read of a value two writes back.
        let mut planted = Vec::new();
        for key in ["k1", "k2", "k3"] {
            let writes: Vec<&Op> = ops
                .iter()
                .filter(|o| o.key == key && matches!(o.kind, Kind::Write(Some(_))))
                .collect();
            let old = writes[writes.len() / 2].kind;
            let Kind::Write(v) = old else { unreachable!() };
            let read = get(99, t, t + 5, v);
            planted.push(Op {
                key: key.to_string(),
                ..read
            });
        }
        ops.extend(planted.iter().cloned());

        let started = Instant::now();
        let report = check(&ops);
        let took = started.elapsed();
        let stale: Vec<&Op> = report.violations.iter().map(Violation::read).collect();
        assert_eq!(stale, planted.iter().collect::<Vec<_>>());
        assert!(report.stats.hits > 10_000, "{}", report.stats);
        println!("{} in {took:?}", report.stats);
        if !cfg!(debug_assertions) {
            assert!(took.as_millis() < 1000, "checking took {took:?}");
        }
    }
}
