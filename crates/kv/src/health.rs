//! The one failure detector behind every health check of kvswitch: the controller's probes of
//! the pool's servers, the fabric keeper's probes of the fabric switches, and the switch's
//! check of the cache nodes its steering entries lead to. A target is taken for down after
//! `down_after` failed checks in a row and for up again after `up_after` answers in a row.
//! It keeps no clock: the caller checks at its own pace and hands each outcome in.

/// How many outcomes in a row change a target's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Failed checks in a row that take an up target down (at least 1).
    pub down_after: u32,
    /// Answers in a row that bring a down target up (at least 1).
    pub up_after: u32,
}

/// A change of state that an outcome made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Down,
    Up,
}

/// One target's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detector {
    /// Whether an outcome has been taken in yet, for a detector whose first outcome decides.
    known: bool,
    up: bool,
    failed_in_row: u32,
    answered_in_row: u32,
}

impl Detector {
    /// A target taken for up until `down_after` failures in a row say otherwise.
    pub fn up() -> Detector {
        Detector {
            known: true,
            up: true,
            failed_in_row: 0,
            answered_in_row: 0,
        }
    }

    /// A target taken for down until `up_after` answers in a row say otherwise (one that was
    /// found down before this detector took over).
    pub fn down() -> Detector {
        Detector {
            up: false,
            ..Detector::up()
        }
    }

    /// A target counted as up while nothing is known of it, whose first outcome decides at
    /// once, without a run of them: a controller that has just started (or just taken the
    /// lead) puts no dead server back, and takes no live one out.
    pub fn unknown() -> Detector {
        Detector {
            known: false,
            ..Detector::up()
        }
    }

    /// Takes in one outcome; the change it made, if any.
    pub fn record(&mut self, answered: bool, t: Thresholds) -> Option<Change> {
        if answered {
            self.failed_in_row = 0;
            self.answered_in_row = self.answered_in_row.saturating_add(1);
        } else {
            self.answered_in_row = 0;
            self.failed_in_row = self.failed_in_row.saturating_add(1);
        }
        let was = self.up;
        if !self.known {
            self.known = true;
            self.up = answered;
        } else if answered && !self.up && self.answered_in_row >= t.up_after.max(1) {
            self.up = true;
        } else if !answered && self.up && self.failed_in_row >= t.down_after.max(1) {
            self.up = false;
        }
        match (was, self.up) {
            (true, false) => Some(Change::Down),
            (false, true) => Some(Change::Up),
            _ => None,
        }
    }

    /// Takes the target down now, whatever its run (another witness says it failed: the
    /// switches' reports of failed requests, a TKO); it comes back as any down target does.
    /// `None` if it was down already or nothing is known of it yet.
    pub fn take_down(&mut self) -> Option<Change> {
        if !self.known || !self.up {
            return None;
        }
        self.up = false;
        self.answered_in_row = 0;
        Some(Change::Down)
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Whether an outcome has been taken in yet (always, but for [`Detector::unknown`]).
    pub fn is_known(&self) -> bool {
        self.known
    }

    pub fn failed_in_row(&self) -> u32 {
        self.failed_in_row
    }

    pub fn answered_in_row(&self) -> u32 {
        self.answered_in_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        down_after: 3,
        up_after: 2,
    };

    fn run(d: &mut Detector, outcomes: &[bool]) -> Vec<Option<Change>> {
        outcomes.iter().map(|&ok| d.record(ok, T)).collect()
    }

    #[test]
    fn down_after_failures_in_a_row_and_up_after_answers_in_a_row() {
        let mut d = Detector::up();
        // Two failures, an answer, three failures: down at the third of those.
        let changes = run(&mut d, &[false, false, true, false, false, false, false]);
        assert_eq!(
            changes,
            [None, None, None, None, None, Some(Change::Down), None]
        );
        assert_eq!(d.failed_in_row(), 4);
        // An answer, a failure, two answers: up at the second of those.
        let changes = run(&mut d, &[true, false, true, true, true]);
        assert_eq!(changes, [None, None, None, Some(Change::Up), None]);
        assert!(d.is_up());
    }

    #[test]
    fn an_unknown_target_is_decided_by_its_first_outcome() {
        let mut d = Detector::unknown();
        assert!(d.is_up() && !d.is_known());
        assert_eq!(d.record(false, T), Some(Change::Down));
        assert_eq!(run(&mut d, &[true]), [None]);
        let mut d = Detector::unknown();
        assert_eq!(d.record(true, T), None);
        assert!(d.is_up() && d.is_known());
    }

    #[test]
    fn a_target_taken_down_comes_back_by_its_answers() {
        let mut d = Detector::unknown();
        assert_eq!(d.take_down(), None, "nothing known yet");
        d.record(true, T);
        assert_eq!(d.take_down(), Some(Change::Down));
        assert_eq!(d.take_down(), None, "down already");
        assert_eq!(run(&mut d, &[true, true]), [None, Some(Change::Up)]);
        let mut d = Detector::down();
        assert_eq!(run(&mut d, &[true, true]), [None, Some(Change::Up)]);
    }

    #[test]
    fn thresholds_of_zero_act_as_one() {
        let t = Thresholds {
            down_after: 0,
            up_after: 0,
        };
        let mut d = Detector::up();
        assert_eq!(d.record(false, t), Some(Change::Down));
        assert_eq!(d.record(true, t), Some(Change::Up));
    }
}
