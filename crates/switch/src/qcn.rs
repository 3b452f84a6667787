//! QCN, quantized congestion notification (IEEE 802.1Qau, after the QCN pseudo-code version
//! 2.3): the congestion point's feedback and the reaction point's rate limiter, as pure state
//! machines on the caller's clock.
//!
//! The congestion point reads its queue `Q` when it samples a frame and computes
//! `Fb = -(Qoff + w·Qδ)` with `Qoff = Q - Qeq` and `Qδ = Q - Qold`; a negative `Fb` sends the
//! frame's source a notification carrying `|Fb|` quantized to 6 bits. The reaction point cuts
//! its rate by `Gd·|Fb|` on each notification, remembering the rate it had as its target, then
//! recovers in cycles counted by bytes sent and by a timer: fast recovery halves the distance
//! to the target for `F` cycles; then active increase raises the target by `R_AI` a cycle, and
//! hyper-active increase (both counters past `F`) by `R_HAI` times the cycles past `F`.
//!
//! The message a congestion point sends is [`Notification`]: UDP to the sampled frame's source
//! address and port, so an unmodified IP network carries it.

use kv::Instant;
use std::time::Duration;

/// The congestion point's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpParams {
    /// The queue length it steers towards, in bytes.
    pub q_eq: u64,
    /// The weight of the queue's growth against its offset (2 in the standard).
    pub w: f64,
}

impl Default for CpParams {
    fn default() -> Self {
        CpParams {
            q_eq: 20_000,
            w: 2.0,
        }
    }
}

/// The most a quantized feedback holds.
pub const FB_MAX: u8 = 63;

/// A congestion point: one queue's feedback.
#[derive(Clone, Debug)]
pub struct Cp {
    params: CpParams,
    q_old: u64,
}

impl Cp {
    pub fn new(params: CpParams) -> Cp {
        Cp { params, q_old: 0 }
    }

    /// A frame sampled while the queue holds `q` bytes: the quantized `|Fb|` (1 to
    /// [`FB_MAX`]) to send its source, or `None` when there is no congestion.
    pub fn sample(&mut self, q: u64) -> Option<u8> {
        let q_off = q as f64 - self.params.q_eq as f64;
        let q_delta = q as f64 - self.q_old as f64;
        self.q_old = q;
        let fb = -(q_off + self.params.w * q_delta);
        if fb >= 0.0 {
            return None;
        }
        // |Fb| is quantized against Qeq·(2w + 1): a queue at twice its set point that grew by
        // a set point since the last sample, and more, is FB_MAX.
        let full = self.params.q_eq.max(1) as f64 * (2.0 * self.params.w + 1.0);
        let quantized = (-fb / full * f64::from(FB_MAX)).ceil();
        Some(quantized.clamp(1.0, f64::from(FB_MAX)) as u8)
    }
}

/// The reaction point's settings (rates in bits a second).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RpParams {
    /// The rate it starts at and never exceeds (its line rate).
    pub max_rate: f64,
    /// The lowest rate a cut takes it to.
    pub min_rate: f64,
    /// Each unit of quantized feedback cuts the rate by this fraction (1/128).
    pub gd: f64,
    /// The most one notification cuts, as a fraction of the rate (0.5).
    pub max_cut: f64,
    /// Bytes sent per byte-counter cycle (in active increase, half).
    pub bc_limit: u64,
    /// The timer's cycle (in active increase, half).
    pub timer: Duration,
    /// Cycles of fast recovery before increase (5).
    pub fast_recovery: u32,
    /// Active increase: added to the target each cycle.
    pub r_ai: f64,
    /// Hyper-active increase: times the cycles past fast recovery.
    pub r_hai: f64,
    /// The share of frames marked for sampling with no feedback, and with the largest.
    pub mark_min: f64,
    pub mark_max: f64,
}

impl RpParams {
    /// The baseline ServerSwitch ran at 1 Gb/s (R_AI 5 Mb/s, R_HAI 50 Mb/s, 150 KB byte
    /// cycles, a 15 ms timer, Gd 1/128) with its rates scaled to a line rate of `max_rate`.
    /// Frames are marked for sampling at 5% to 20% rather than QCN's 1% to 10%: at tens of
    /// megabits a second 1% gives a notification only every few timer cycles.
    pub fn scaled(max_rate: f64) -> RpParams {
        let scale = max_rate / 1e9;
        RpParams {
            max_rate,
            min_rate: max_rate / 1000.0,
            gd: 1.0 / 128.0,
            max_cut: 0.5,
            bc_limit: 150_000,
            timer: Duration::from_millis(15),
            fast_recovery: 5,
            r_ai: 5e6 * scale,
            r_hai: 50e6 * scale,
            mark_min: 0.05,
            mark_max: 0.2,
        }
    }
}

/// Which phase a reaction point is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No notification since it reached its line rate.
    Idle,
    FastRecovery,
    ActiveIncrease,
    HyperActiveIncrease,
}

/// A reaction point: one sender's rate.
#[derive(Clone, Debug)]
pub struct Rp {
    p: RpParams,
    current: f64,
    target: f64,
    limited: bool,
    bytes: u64,
    byte_cycles: u32,
    timer_cycles: u32,
    next_timer: Option<Instant>,
    mark: f64,
    pub notifications: u64,
}

impl Rp {
    pub fn new(p: RpParams) -> Rp {
        Rp {
            current: p.max_rate,
            target: p.max_rate,
            limited: false,
            bytes: 0,
            byte_cycles: 0,
            timer_cycles: 0,
            next_timer: None,
            mark: p.mark_min,
            notifications: 0,
            p,
        }
    }

    /// The rate to send at now, in bits a second.
    pub fn rate(&self) -> f64 {
        self.current
    }

    pub fn target(&self) -> f64 {
        self.target
    }

    /// The share of frames to mark for the congestion point to sample.
    pub fn mark_probability(&self) -> f64 {
        self.mark
    }

    /// The phase by the cycles counted: fast recovery for the first `F` of each counter.
    pub fn phase(&self) -> Phase {
        let f = self.p.fast_recovery;
        match (self.limited, self.byte_cycles > f, self.timer_cycles > f) {
            (false, _, _) => Phase::Idle,
            (true, false, false) => Phase::FastRecovery,
            (true, true, true) => Phase::HyperActiveIncrease,
            _ => Phase::ActiveIncrease,
        }
    }

    /// A notification with quantized feedback `fb` arrived at `now` (0, a queue reply,
    /// changes nothing).
    pub fn notified(&mut self, fb: u8, now: Instant) {
        if fb == 0 {
            return;
        }
        let fb = f64::from(fb.min(FB_MAX));
        self.notifications += 1;
        self.target = self.current;
        let cut = (self.p.gd * fb).min(self.p.max_cut);
        self.current = (self.current * (1.0 - cut)).max(self.p.min_rate);
        self.limited = true;
        self.bytes = 0;
        self.byte_cycles = 0;
        self.timer_cycles = 0;
        self.next_timer = Some(now + self.p.timer);
        self.mark = self.p.mark_min + (self.p.mark_max - self.p.mark_min) * fb / f64::from(FB_MAX);
    }

    /// `bytes` were sent at `now`.
    pub fn sent(&mut self, bytes: u64, now: Instant) {
        if !self.limited {
            return;
        }
        self.bytes += bytes;
        // Each counter's cycle halves once that counter is past fast recovery.
        let limit = match self.byte_cycles >= self.p.fast_recovery {
            true => self.p.bc_limit / 2,
            false => self.p.bc_limit,
        }
        .max(1);
        if self.bytes >= limit {
            self.bytes = 0;
            self.byte_cycles += 1;
            self.increase();
        }
        self.tick(now);
    }

    /// The timer's cycles up to `now`.
    pub fn tick(&mut self, now: Instant) {
        while let Some(at) = self.next_timer.filter(|&at| self.limited && now >= at) {
            self.timer_cycles += 1;
            self.increase();
            let period = match self.timer_cycles >= self.p.fast_recovery {
                true => self.p.timer / 2,
                false => self.p.timer,
            };
            self.next_timer = Some(at + period);
        }
    }

    fn increase(&mut self) {
        let f = self.p.fast_recovery;
        match self.phase() {
            Phase::Idle => return,
            Phase::FastRecovery => {}
            Phase::ActiveIncrease => self.target += self.p.r_ai,
            Phase::HyperActiveIncrease => {
                let past = self.byte_cycles.min(self.timer_cycles) - f;
                self.target += self.p.r_hai * f64::from(past);
            }
        }
        self.target = self.target.min(self.p.max_rate);
        self.current = ((self.current + self.target) / 2.0).min(self.p.max_rate);
        self.mark = self.p.mark_min;
        if self.current >= self.p.max_rate * 0.999 {
            self.current = self.p.max_rate;
            self.limited = false;
            self.next_timer = None;
        }
    }
}

/// A congestion notification as the congestion point sends it: `QCN1`, the quantized `|Fb|`,
/// the queue length in bytes and the set point (both big-endian, 4 bytes). A feedback of 0
/// is a queue reply: the answer to a query, which asks for no change of rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notification {
    pub fb: u8,
    pub queue: u32,
    pub q_eq: u32,
}

const MAGIC: &[u8; 4] = b"QCN1";
/// The notification's length.
pub const NOTIFICATION_LEN: usize = 13;

impl Notification {
    pub fn emit(&self) -> [u8; NOTIFICATION_LEN] {
        let mut out = [0u8; NOTIFICATION_LEN];
        out[..4].copy_from_slice(MAGIC);
        out[4] = self.fb;
        out[5..9].copy_from_slice(&self.queue.to_be_bytes());
        out[9..13].copy_from_slice(&self.q_eq.to_be_bytes());
        out
    }

    /// `None` for anything else, including a feedback past [`FB_MAX`].
    pub fn parse(bytes: &[u8]) -> Option<Notification> {
        if bytes.len() != NOTIFICATION_LEN || &bytes[..4] != MAGIC {
            return None;
        }
        let fb = bytes[4];
        if fb > FB_MAX {
            return None;
        }
        let word = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        Some(Notification {
            fb,
            queue: word(5),
            q_eq: word(9),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_is_negative_only_above_the_set_point_or_while_the_queue_grows() {
        let mut cp = Cp::new(CpParams {
            q_eq: 10_000,
            w: 2.0,
        });
        assert_eq!(cp.sample(0), None);
        assert_eq!(
            cp.sample(3_000),
            None,
            "below Qeq, growing slowly: -7000 + 2*3000 < 0"
        );
        assert!(
            cp.sample(8_000).is_some(),
            "below Qeq, growing fast: -2000 + 2*5000 > 0"
        );
        assert!(cp.sample(12_000).is_some(), "above Qeq and growing");
        // Steady above Qeq: |Fb| = 2000 of the 50,000 that quantize to 63.
        assert_eq!(cp.sample(12_000), Some(3));
        assert_eq!(cp.sample(8_000), None, "above nothing once it shrinks");
        // The largest congestion is capped.
        let mut cp = Cp::new(CpParams {
            q_eq: 10_000,
            w: 2.0,
        });
        assert_eq!(cp.sample(1_000_000), Some(FB_MAX));
    }

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn a_notification_cuts_the_rate_and_recovery_returns_to_the_line_rate() {
        let p = RpParams::scaled(100e6);
        let mut rp = Rp::new(p);
        assert_eq!((rp.rate(), rp.phase()), (100e6, Phase::Idle));
        rp.notified(FB_MAX, at(0));
        assert_eq!(
            rp.rate(),
            100e6 * (1.0 - 63.0 / 128.0),
            "Gd·|Fb| off the rate"
        );
        assert_eq!(rp.target(), 100e6);
        assert_eq!(rp.phase(), Phase::FastRecovery);
        assert!((rp.mark_probability() - p.mark_max).abs() < 1e-9);
        // Fast recovery: each timer cycle halves the distance to the target.
        let cut = rp.rate();
        rp.tick(at(15));
        assert_eq!(rp.rate(), (cut + 100e6) / 2.0);
        rp.tick(at(30));
        assert_eq!(rp.rate(), ((cut + 100e6) / 2.0 + 100e6) / 2.0);
        // Then increase; with bytes flowing too, hyper-active increase; back at the line rate.
        let mut now = 30;
        while rp.phase() != Phase::Idle && now < 60_000 {
            now += 1;
            rp.sent(12_500, at(now));
        }
        assert_eq!((rp.rate(), rp.phase()), (100e6, Phase::Idle));
        assert!(now < 5_000, "recovered in {now} ms");
    }

    #[test]
    fn fast_recovery_lasts_five_cycles_then_the_target_rises() {
        let mut p = RpParams::scaled(100e6);
        p.bc_limit = u64::MAX / 4;
        let mut rp = Rp::new(p);
        rp.notified(32, at(0));
        rp.notified(32, at(0));
        let target = rp.target();
        for cycle in 1..=5 {
            rp.tick(at(15 * cycle));
            assert_eq!(rp.target(), target, "cycle {cycle} is fast recovery");
            assert_eq!(rp.phase(), Phase::FastRecovery);
        }
        // The timer's cycles halve once past fast recovery: the sixth ends 7.5 ms later.
        rp.tick(at(75 + 7));
        assert_eq!(rp.target(), target);
        rp.tick(at(75 + 8));
        assert_eq!(rp.target(), target + p.r_ai, "active increase");
        assert_eq!(rp.phase(), Phase::ActiveIncrease);
    }

    #[test]
    fn active_increase_raises_the_target_past_the_rate_it_was_cut_from() {
        let mut p = RpParams::scaled(100e6);
        p.bc_limit = u64::MAX / 4;
        let mut rp = Rp::new(p);
        rp.notified(32, at(0));
        rp.notified(32, at(1));
        let cut_from = rp.target();
        // Timer cycles only: fast recovery, then active increase (never hyper-active).
        for ms in (0..200).map(|i| 2 + i * 5) {
            rp.tick(at(ms));
            assert_ne!(rp.phase(), Phase::HyperActiveIncrease);
        }
        assert!(rp.target() > cut_from, "{} > {cut_from}", rp.target());
    }

    #[test]
    fn notifications_round_trip_and_refuse_anything_else() {
        let n = Notification {
            fb: 9,
            queue: 123_456,
            q_eq: 20_000,
        };
        assert_eq!(Notification::parse(&n.emit()), Some(n));
        let bytes = n.emit();
        for len in 0..bytes.len() {
            assert_eq!(Notification::parse(&bytes[..len]), None);
        }
        for fb in [64u8, 255] {
            let mut b = bytes;
            b[4] = fb;
            assert_eq!(Notification::parse(&b), None);
        }
        let mut b = bytes;
        b[0] = b'X';
        assert_eq!(Notification::parse(&b), None);
    }
}
