//! The data plane's driver: frames from the ports go through a switch application, and its
//! fates and the frames it originates go out of the ports, counted per port. The loop sleeps
//! until a frame arrives or the application says it next needs time ([`Datapath::poll_at`]),
//! so an idle switch does not wake every few milliseconds for nothing.
//!
//! Policy lives in the application; where a frame goes once the application has decided is
//! [`fanout`]'s pure rules. The same [`Driver`] runs AF_PACKET ports in the daemon and
//! in-memory ports in tests, one step at a time ([`Driver::drain`], [`Driver::tick_if_due`]).

mod egress;
pub mod fanout;
pub mod remote;

use egress::{transmit, Egress};
pub use egress::{EgressSettings, DEFAULT_DEPTH};

pub use remote::{remote, Inbox, Job, Remote, RemoteError};

use std::sync::Arc;
use std::time::Duration;

use kv::Instant;
use kvio::{Batch, Poller, Port};
use switch::stats::{Drop, Stats};
use switch::{Emit, Fate, Switch};

/// What a driver drives: frames and time in, fates and originated frames out.
pub trait Datapath {
    /// Handles one frame received on `in_port`; may rewrite it in place and append frames to
    /// `emit`. `csum_ready` is false when the sender left the UDP/TCP checksum to offload.
    fn process(
        &mut self,
        in_port: u16,
        frame: &mut [u8],
        csum_ready: bool,
        now: Instant,
        emit: &mut Vec<Emit>,
    ) -> Fate;
    /// Periodic work due at `now`.
    fn tick(&mut self, now: Instant, emit: &mut Vec<Emit>);
    /// When [`Datapath::tick`] next has work; an instant not after now means at once, `None`
    /// that nothing waits.
    fn poll_at(&self) -> Option<Instant>;
}

/// A switch application is driven through its own `process`, `tick` and `poll_at`.
macro_rules! datapath {
    ($app:ty) => {
        impl Datapath for $app {
            fn process(
                &mut self,
                in_port: u16,
                frame: &mut [u8],
                csum_ready: bool,
                now: Instant,
                emit: &mut Vec<Emit>,
            ) -> Fate {
                <$app>::process(self, in_port, frame, csum_ready, now, emit)
            }

            fn tick(&mut self, now: Instant, emit: &mut Vec<Emit>) {
                <$app>::tick(self, now, emit)
            }

            fn poll_at(&self) -> Option<Instant> {
                <$app>::poll_at(self)
            }
        }
    };
}

datapath!(Switch);
datapath!(switch::fabric::FabricSwitch);

/// Work the loop serves beside the ports, on the forwarding thread with the application:
/// the CPU channel's agents.
pub trait Side<D> {
    /// Appends the descriptors the loop also waits on.
    fn fds(&self, out: &mut Vec<std::os::fd::RawFd>);
    /// Changes whenever [`Side::fds`] would answer differently.
    fn generation(&self) -> u64;
    /// Serves what waits on its descriptors and what the application holds for it; called
    /// every round. Returns whether it did any work.
    fn serve(&mut self, app: &mut D, now: Instant, emit: &mut Vec<Emit>) -> bool;
    /// Whether work is left that no descriptor will announce (a reader whose queue was full):
    /// the loop then sleeps at most [`SIDE_RETRY`].
    fn pending(&self) -> bool;
}

/// How long the loop sleeps at most while a [`Side`] has work pending.
pub const SIDE_RETRY: Duration = Duration::from_millis(1);

/// Frames received from one port per call.
pub const BATCH: usize = 64;
/// Batches taken from one port before the others get their turn.
const ROUNDS_PER_PORT: usize = 8;

/// How the loop waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    /// After a frame, keep checking the ports without sleeping for this long. Under load the
    /// next frame usually arrives within it, which saves a sleep and a wake-up (a context
    /// switch each way, the largest cost per frame on a small machine); idle, the loop
    /// blocks again.
    pub busy_poll: Duration,
    /// The longest the loop sleeps, whatever the application says: the stop flag and the
    /// periodic callback are served at least this often, and work another thread gives the
    /// application (the proxy's side of a shared cache) is seen within it.
    pub max_sleep: Duration,
    /// How often the periodic callback runs (a status snapshot).
    pub every: Duration,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            busy_poll: Duration::from_micros(200),
            max_sleep: Duration::from_millis(100),
            every: Duration::from_millis(250),
        }
    }
}

/// Why the loop stopped before it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("waiting for frames: {0}")]
    Wait(#[source] std::io::Error),
}

/// Ports joined through an application.
pub struct Driver<D> {
    ports: Vec<Box<dyn Port>>,
    app: D,
    local: Option<usize>,
    stats: Arc<Stats>,
    rx: Batch,
    emit: Vec<Emit>,
    fates: Vec<Fate>,
    /// Per port, the received frames (by index in `rx`) it sends.
    out_lists: Vec<Vec<usize>>,
    /// Egress queues of ports with a rate.
    egress: Egress,
}

impl<D: Datapath> Driver<D> {
    /// Drives `app` over `ports`, numbered as the application numbers them; `local` is the
    /// local port (floods never reach it); per-port counters and transmit failures go to
    /// `stats`, which must have a slot for every port.
    pub fn new(
        ports: Vec<Box<dyn Port>>,
        app: D,
        local: Option<usize>,
        stats: Arc<Stats>,
    ) -> Driver<D> {
        let n = ports.len();
        Driver {
            ports,
            app,
            local,
            stats,
            rx: Batch::new(BATCH),
            emit: Vec::new(),
            fates: Vec::with_capacity(BATCH),
            out_lists: vec![Vec::with_capacity(BATCH); n],
            egress: Egress::new(EgressSettings::new(n), n),
        }
    }

    /// Takes egress rates and depths from `settings` (made for as many ports) instead of its
    /// own, so that they can be shared before the driver exists.
    pub fn with_egress(mut self, settings: Arc<EgressSettings>) -> Self {
        self.egress = Egress::new(settings, self.ports.len());
        self
    }

    /// The ports' egress rates and depths, to change from another thread.
    pub fn egress(&self) -> Arc<EgressSettings> {
        self.egress.settings()
    }

    pub fn app(&self) -> &D {
        &self.app
    }

    pub fn app_mut(&mut self) -> &mut D {
        &mut self.app
    }

    pub fn ports(&self) -> &[Box<dyn Port>] {
        &self.ports
    }

    /// The ports and the application, the driver gone.
    pub fn into_parts(self) -> (Vec<Box<dyn Port>>, D) {
        (self.ports, self.app)
    }

    /// Receives what port `i` holds (a bounded number of batches, so no port starves the
    /// others), hands every frame to the application at `now` and sends the results. Returns
    /// how many frames were received.
    pub fn drain(&mut self, i: usize, now: Instant) -> usize {
        let mut total = 0;
        for _ in 0..ROUNDS_PER_PORT {
            self.rx.clear();
            let n = match self.ports[i].recv(&mut self.rx) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(port = self.ports[i].name(), "receive failed: {e}");
                    0
                }
            };
            if n == 0 {
                break;
            }
            total += n;
            self.process_batch(i, n, now);
            if n < BATCH {
                break;
            }
        }
        total
    }

    fn process_batch(&mut self, i: usize, n: usize, now: Instant) {
        let pc = &self.stats.ports[i];
        self.fates.clear();
        for j in 0..n {
            switch::stats::add(&pc.rx_packets, 1);
            switch::stats::add(&pc.rx_bytes, self.rx.frame(j).len() as u64);
            let csum_ready = !self.rx.csum_not_ready(j);
            let fate = self.app.process(
                i as u16,
                self.rx.frame_mut(j),
                csum_ready,
                now,
                &mut self.emit,
            );
            self.fates.push(fate);
        }
        for list in self.out_lists.iter_mut() {
            list.clear();
        }
        let ports = self.ports.len();
        for (j, &fate) in self.fates.iter().enumerate() {
            if fanout::out_of_range(fate, ports) {
                self.stats.count_drop(Drop::NoAction);
            }
            let lists = &mut self.out_lists;
            fanout::fate_ports(fate, i, ports, self.local, |p| lists[p].push(j));
        }
        for (p, list) in self.out_lists.iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let frames: Vec<&[u8]> = list.iter().map(|&j| self.rx.frame(j)).collect();
            match self.egress.shaped(p) {
                true => self.egress.enqueue(p, &frames, &self.stats),
                false => transmit(self.ports[p].as_mut(), &frames, &self.stats, p),
            }
        }
        self.flush_emits();
        self.egress.drain(now, &mut self.ports, &self.stats);
    }

    /// Ticks the application if it said it needs time by `now`, and sends what it emitted.
    /// Returns whether it ticked.
    pub fn tick_if_due(&mut self, now: Instant) -> bool {
        if self.app.poll_at().is_none_or(|t| t > now) {
            return false;
        }
        self.app.tick(now, &mut self.emit);
        self.flush_emits();
        true
    }

    /// How long the loop may sleep at `now`: until the application's next deadline, at most
    /// `max`.
    pub fn sleep_for(&self, now: Instant, max: Duration) -> Duration {
        let next = match (self.app.poll_at(), self.egress.next_ready(now)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            Some(t) => t.duration_since(now).min(max),
            None => max,
        }
    }

    /// Follows changed egress settings and sends what the egress queues let go by `now`.
    pub fn run_egress(&mut self, now: Instant) {
        self.egress.sync(&mut self.ports, &self.stats);
        self.egress.drain(now, &mut self.ports, &self.stats);
    }

    /// One send per port for everything it gets, in the order the application emitted it.
    fn flush_emits(&mut self) {
        if self.emit.is_empty() {
            return;
        }
        for (p, port) in self.ports.iter_mut().enumerate() {
            let frames: Vec<&[u8]> = self
                .emit
                .iter()
                .filter(|e| fanout::emit_goes_to(e.dest, p, self.local))
                .map(|e| e.frame.as_slice())
                .collect();
            if frames.is_empty() {
                continue;
            }
            match self.egress.shaped(p) {
                true => self.egress.enqueue(p, &frames, &self.stats),
                false => transmit(port.as_mut(), &frames, &self.stats, p),
            }
        }
        self.emit.clear();
    }

    /// Runs the jobs `inbox` holds, at most [`remote::JOBS_PER_ROUND`], and sends what they
    /// emit.
    pub fn run_jobs(&mut self, inbox: &Inbox<D>, now: Instant) -> usize {
        let ran = inbox.run(&mut self.app, now, &mut self.emit, remote::JOBS_PER_ROUND);
        self.flush_emits();
        ran
    }

    /// Runs until `stop` says so: waits for frames, control jobs from `inbox` or the
    /// application's next deadline, processes, runs jobs between batches, ticks when due,
    /// and calls `periodic` every `opts.every`. Time is the wall clock on [`kvio::clock`].
    pub fn run(
        &mut self,
        opts: &RunOptions,
        inbox: Option<&Inbox<D>>,
        stop: &dyn Fn() -> bool,
        periodic: &mut dyn FnMut(&D),
    ) -> Result<(), RunError> {
        self.run_with(opts, inbox, None, stop, periodic)
    }

    /// [`Driver::run`], serving `side` each round as well: its descriptors wake the loop,
    /// and it runs after the ports, so what they handed it goes out in the same round.
    pub fn run_with(
        &mut self,
        opts: &RunOptions,
        inbox: Option<&Inbox<D>>,
        mut side: Option<&mut dyn Side<D>>,
        stop: &dyn Fn() -> bool,
        periodic: &mut dyn FnMut(&D),
    ) -> Result<(), RunError> {
        let mut fds: Vec<std::os::fd::RawFd> = Vec::new();
        let mut side_generation = None;
        let mut poller = Poller::new(&[]);
        let mut ready: Vec<usize> = Vec::with_capacity(self.ports.len());
        let mut last_work = std::time::Instant::now();
        let mut last_periodic = std::time::Instant::now();
        while !stop() {
            let generation = side.as_ref().map(|s| s.generation());
            if fds.is_empty() || generation != side_generation {
                side_generation = generation;
                fds.clear();
                fds.extend(self.ports.iter().map(|p| p.fd()));
                // Polled after the ports: its index is the port count.
                fds.extend(inbox.map(Inbox::fd));
                if let Some(s) = &side {
                    s.fds(&mut fds);
                }
                poller = Poller::new(&fds);
            }
            self.egress.sync(&mut self.ports, &self.stats);
            let wall = std::time::Instant::now();
            if wall.duration_since(last_work) < opts.busy_poll {
                ready.clear();
                ready.extend((0..self.ports.len()).filter(|&i| self.ports[i].rx_ready()));
                if ready.is_empty() {
                    // Nothing yet: let whatever else wants this core run (on a busy machine
                    // the servers and clients share it) without giving up our turn to a
                    // full sleep.
                    std::thread::yield_now();
                }
            } else {
                let until_periodic = opts
                    .every
                    .saturating_sub(wall.duration_since(last_periodic));
                let mut timeout = self.sleep_for(kvio::clock::at(wall), opts.max_sleep);
                if side.as_ref().is_some_and(|s| s.pending()) {
                    timeout = timeout.min(SIDE_RETRY);
                }
                poller
                    .wait(timeout.min(until_periodic), &mut ready)
                    .map_err(RunError::Wait)?;
            }
            let wall = std::time::Instant::now();
            let now = kvio::clock::at(wall);
            if let Some(inbox) = inbox.filter(|_| ready.contains(&self.ports.len())) {
                inbox.settle();
            }
            for &i in &ready {
                // Only frames count as work: a port that cannot tell answers `rx_ready` with
                // `true` even when idle.
                if i < self.ports.len() && self.drain(i, now) > 0 {
                    last_work = wall;
                }
            }
            if let Some(inbox) = inbox {
                if self.run_jobs(inbox, now) > 0 {
                    last_work = wall;
                }
            }
            if let Some(s) = side.as_mut() {
                if s.serve(&mut self.app, now, &mut self.emit) {
                    last_work = wall;
                }
                self.flush_emits();
            }
            self.tick_if_due(now);
            self.run_egress(now);
            if wall.duration_since(last_periodic) >= opts.every {
                last_periodic = wall;
                periodic(&self.app);
            }
        }
        Ok(())
    }
}
