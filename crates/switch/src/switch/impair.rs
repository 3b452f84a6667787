//! The operator's `impair` action: a faulty link in the pipeline, for tests of what runs over
//! the switch (loss, duplication, reordering, delay), seeded by the switch's own seed. An
//! entry's `impair` action sets [`REG_IMPAIR`] to its profile's number; once the pipeline has
//! decided where the frame goes, [`Impairments::decide`] draws what happens to it, and a
//! frame that must wait is held here until [`Impairments::release`] lets it go at a tick.

use std::collections::BTreeMap;
use std::time::Duration;

use kv::rng::{Rng, Xoshiro256StarStar};
use kv::Instant;

use super::Emit;
use crate::control::{ImpairDef, MAX_IMPAIRED_HELD, MAX_IMPAIRMENTS, MAX_IMPAIR_DELAY_US};

/// The metadata register an `impair` action sets: its profile's number, from 1 (0: none). The
/// last register, above the operators' own.
pub(crate) const REG_IMPAIR: usize = pipeline::NUM_REGS - 1;

/// What one frame's draw decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    Drop,
    /// Send `copies` of it (1 or 2), each after `wait`.
    Send {
        copies: u8,
        wait: Duration,
    },
}

/// The profiles in use, their generator, and the frames held back.
pub(super) struct Impairments {
    /// By number less one; a slot no entry names any more is freed for the next profile.
    defs: Vec<Option<ImpairDef>>,
    rng: Xoshiro256StarStar,
    /// Held frames by release time, then arrival.
    held: BTreeMap<(Instant, u64), Emit>,
    arrivals: u64,
}

impl Impairments {
    pub(super) fn new(seed: u64) -> Impairments {
        Impairments {
            defs: Vec::new(),
            // Apart from the switch's other draws, so that adding an impairment changes
            // nothing else a seed replays.
            rng: Xoshiro256StarStar::seed_from_u64(seed ^ 0x1a9a_17ed_5eed_0001),
            held: BTreeMap::new(),
            arrivals: 0,
        }
    }

    /// The number `REG_IMPAIR` holds for `def` (the same profile always has the same one).
    pub(super) fn number(&mut self, def: &ImpairDef) -> Result<u32, String> {
        let shares = [def.drop_ppm, def.duplicate_ppm, def.reorder_ppm];
        if shares.iter().map(|&s| u64::from(s)).sum::<u64>() > 1_000_000 {
            return Err(
                "drop_ppm, duplicate_ppm and reorder_ppm add up to more than a million \
                 (all frames)"
                    .into(),
            );
        }
        if def.delay_us > MAX_IMPAIR_DELAY_US || def.reorder_us > MAX_IMPAIR_DELAY_US {
            return Err(format!(
                "delay_us and reorder_us are at most {MAX_IMPAIR_DELAY_US} (a second)"
            ));
        }
        if def.reorder_ppm > 0 && def.reorder_us == 0 {
            return Err(
                "reorder_ppm needs reorder_us: how much longer a reordered frame \
                 waits than the others"
                    .into(),
            );
        }
        if let Some(i) = self.defs.iter().position(|d| d.as_ref() == Some(def)) {
            return Ok(i as u32 + 1);
        }
        if let Some(i) = self.defs.iter().position(Option::is_none) {
            self.defs[i] = Some(*def);
            return Ok(i as u32 + 1);
        }
        if self.defs.len() >= MAX_IMPAIRMENTS {
            return Err(format!(
                "the switch's tables name {MAX_IMPAIRMENTS} different impairments at most"
            ));
        }
        self.defs.push(Some(*def));
        Ok(self.defs.len() as u32)
    }

    /// Whether every number is taken.
    pub(super) fn is_full(&self) -> bool {
        self.defs.len() >= MAX_IMPAIRMENTS && self.defs.iter().all(Option::is_some)
    }

    /// Frees every number but those in `live` (the numbers the tables' actions still hold).
    pub(super) fn keep_only(&mut self, live: &std::collections::BTreeSet<u32>) {
        for (i, d) in self.defs.iter_mut().enumerate() {
            if !live.contains(&(i as u32 + 1)) {
                *d = None;
            }
        }
    }

    /// The profile `REG_IMPAIR`'s value `n` names.
    pub(super) fn def(&self, n: u32) -> Option<ImpairDef> {
        *self.defs.get((n as usize).checked_sub(1)?)?
    }

    /// What happens to one frame of profile `n`.
    pub(super) fn decide(&mut self, n: u32) -> Effect {
        let Some(d) = self.def(n) else {
            return Effect::Send {
                copies: 1,
                wait: Duration::ZERO,
            };
        };
        let draw = self.rng.below(1_000_000) as u32;
        let delay = Duration::from_micros(u64::from(d.delay_us));
        let (drop, dup, reorder) = (d.drop_ppm, d.duplicate_ppm, d.reorder_ppm);
        if draw < drop {
            Effect::Drop
        } else if draw < drop + dup {
            Effect::Send {
                copies: 2,
                wait: delay,
            }
        } else if draw < drop + dup + reorder {
            Effect::Send {
                copies: 1,
                wait: delay + Duration::from_micros(u64::from(d.reorder_us)),
            }
        } else {
            Effect::Send {
                copies: 1,
                wait: delay,
            }
        }
    }

    /// Holds `frame` until `at`; false (and nothing held) when the limit is reached.
    pub(super) fn hold(&mut self, at: Instant, frame: Emit) -> bool {
        if self.held.len() >= MAX_IMPAIRED_HELD {
            return false;
        }
        self.arrivals += 1;
        self.held.insert((at, self.arrivals), frame);
        true
    }

    /// Sends the held frames that are due by `now`, in their order.
    pub(super) fn release(&mut self, now: Instant, emit: &mut Vec<Emit>) {
        while let Some(entry) = self.held.first_entry() {
            if entry.key().0 > now {
                break;
            }
            emit.push(entry.remove());
        }
    }

    /// When the next held frame is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.held.keys().next().map(|(at, _)| *at)
    }

    /// Frames held now.
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dest;

    fn frame(n: u8) -> Emit {
        Emit {
            dest: Dest::Port(1),
            frame: vec![n],
        }
    }

    #[test]
    fn held_frames_leave_when_due_in_their_order_and_no_more_are_held_than_the_limit() {
        let mut im = Impairments::new(7);
        let t0 = Instant::from_secs(1);
        let ms = Duration::from_millis;
        assert!(im.hold(t0 + ms(2), frame(1)));
        assert!(im.hold(t0 + ms(1), frame(2)));
        assert!(im.hold(t0 + ms(2), frame(3)));
        assert_eq!(im.next_due(), Some(t0 + ms(1)));
        let mut out = Vec::new();
        im.release(t0, &mut out);
        assert!(out.is_empty());
        im.release(t0 + ms(2), &mut out);
        let order: Vec<u8> = out.iter().map(|e| e.frame[0]).collect();
        assert_eq!(order, [2, 1, 3]);
        assert_eq!((im.held(), im.next_due()), (0, None));
        for i in 0..MAX_IMPAIRED_HELD {
            assert!(im.hold(t0, frame(i as u8)));
        }
        assert!(!im.hold(t0, frame(0)), "past the limit");
    }

    #[test]
    fn a_profile_keeps_its_number_and_bad_ones_are_refused() {
        let mut im = Impairments::new(7);
        let a = ImpairDef {
            drop_ppm: 10,
            ..ImpairDef::default()
        };
        let b = ImpairDef {
            delay_us: 5,
            ..ImpairDef::default()
        };
        assert_eq!(im.number(&a), Ok(1));
        assert_eq!(im.number(&b), Ok(2));
        assert_eq!(im.number(&a), Ok(1));
        assert_eq!(im.def(2), Some(b));
        assert_eq!(im.def(0), None);
        assert_eq!(im.def(3), None);
        // A number no profile has impairs nothing.
        assert_eq!(
            im.decide(9),
            Effect::Send {
                copies: 1,
                wait: Duration::ZERO
            }
        );
        let everything = ImpairDef {
            drop_ppm: 1_000_000,
            ..ImpairDef::default()
        };
        let n = im.number(&everything).unwrap();
        assert!((0..100).all(|_| im.decide(n) == Effect::Drop));
        // Numbers no entry holds any more are given to new profiles; the others keep theirs.
        im.keep_only(&[2].into_iter().collect());
        assert_eq!((im.def(1), im.def(2), im.def(3)), (None, Some(b), None));
        assert_eq!(im.number(&everything), Ok(1));
        let mut full = Impairments::new(1);
        for d in 0..MAX_IMPAIRMENTS as u32 {
            let def = ImpairDef {
                delay_us: d,
                ..ImpairDef::default()
            };
            assert!(!full.is_full());
            full.number(&def).unwrap();
        }
        let one_more = ImpairDef {
            delay_us: 99_999,
            ..ImpairDef::default()
        };
        assert!(full.is_full());
        assert!(full.number(&one_more).is_err());
        assert_eq!(
            full.number(&ImpairDef::default()),
            Ok(1),
            "a profile it has"
        );
    }
}
