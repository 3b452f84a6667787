//! Calls into the switch from other threads: the control API's way in.
//!
//! The switch belongs to the thread that forwards; nothing else holds a lock on it. Another
//! thread hands a [`Job`] to a [`Remote`]; the run loop wakes, runs a bounded number of jobs
//! between batches of frames, and goes on forwarding. A caller never blocks the loop: a full
//! queue refuses the job at once, and the job itself says how its answer gets back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use kv::Instant;
use kvio::Waker;
use switch::Emit;

/// Work run on the forwarding thread with the application, the time, and where frames it
/// originates go.
pub type Job<D> = Box<dyn FnOnce(&mut D, Instant, &mut Vec<Emit>) + Send>;

/// Jobs waiting at most; a caller past this gets [`RemoteError::Busy`].
pub const QUEUE: usize = 64;
/// Jobs run per round of the loop, so that forwarding goes on between them.
pub const JOBS_PER_ROUND: usize = 4;

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    #[error("the switch has {QUEUE} control calls waiting; try again")]
    Busy,
    #[error("the switch is not running")]
    Stopped,
}

/// The sending side, cloned into every thread that calls the switch.
pub struct Remote<D> {
    tx: SyncSender<Job<D>>,
    waker: Arc<Waker>,
    queued: Arc<AtomicUsize>,
}

impl<D> Clone for Remote<D> {
    fn clone(&self) -> Self {
        Remote {
            tx: self.tx.clone(),
            waker: self.waker.clone(),
            queued: self.queued.clone(),
        }
    }
}

/// The receiving side, handed to [`Driver::run`](crate::Driver::run).
pub struct Inbox<D> {
    rx: Receiver<Job<D>>,
    waker: Arc<Waker>,
    /// Jobs submitted and not yet run (counted before they are queued, so never fewer than
    /// the queue holds): a loop that busy-polls looks here, not at the eventfd, each round.
    queued: Arc<AtomicUsize>,
}

/// A connected pair. Fails only if an eventfd cannot be created.
pub fn remote<D>() -> std::io::Result<(Remote<D>, Inbox<D>)> {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let waker = Arc::new(Waker::new()?);
    let queued = Arc::new(AtomicUsize::new(0));
    Ok((
        Remote {
            tx,
            waker: waker.clone(),
            queued: queued.clone(),
        },
        Inbox { rx, waker, queued },
    ))
}

impl<D> Remote<D> {
    /// Queues `job` and wakes the loop.
    pub fn submit(&self, job: Job<D>) -> Result<(), RemoteError> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(job) {
            Ok(()) => {
                // A failed wake only delays the job to the loop's next timeout.
                let _ = self.waker.wake();
                Ok(())
            }
            Err(e) => {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                match e {
                    TrySendError::Full(_) => Err(RemoteError::Busy),
                    TrySendError::Disconnected(_) => Err(RemoteError::Stopped),
                }
            }
        }
    }
}

impl<D> Inbox<D> {
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.waker.fd()
    }

    /// Runs up to `max` waiting jobs; returns how many ran. Leaves the waker set while jobs
    /// remain, so the loop comes back for them without sleeping.
    /// With nothing queued it returns at once, with no system call.
    pub fn run(&self, app: &mut D, now: Instant, emit: &mut Vec<Emit>, max: usize) -> usize {
        if self.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let _ = self.waker.reset();
        let mut ran = 0;
        while ran < max {
            match self.rx.try_recv() {
                Ok(job) => {
                    job(app, now, emit);
                    ran += 1;
                }
                Err(_) => break,
            }
        }
        // Jobs left, or one counted that is not in the queue yet: come back without sleeping.
        if self.queued.fetch_sub(ran, Ordering::AcqRel) > ran {
            let _ = self.waker.wake();
        }
        ran
    }

    /// Makes the eventfd stop polling readable: for a loop that woke on it. A wake whose job
    /// an earlier round already ran would otherwise keep it from sleeping.
    pub(crate) fn settle(&self) {
        let _ = self.waker.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_a_bounded_number_at_a_time() {
        let (remote, inbox) = remote::<Vec<u32>>().unwrap();
        for i in 0..6 {
            remote
                .submit(Box::new(move |v: &mut Vec<u32>, _, _| v.push(i)))
                .unwrap();
        }
        let mut app = Vec::new();
        let mut emit = Vec::new();
        assert_eq!(inbox.run(&mut app, Instant::ZERO, &mut emit, 4), 4);
        assert_eq!(inbox.run(&mut app, Instant::ZERO, &mut emit, 4), 2);
        assert_eq!(app, [0, 1, 2, 3, 4, 5]);
        assert_eq!(inbox.queued.load(Ordering::Acquire), 0);
        assert_eq!(inbox.run(&mut app, Instant::ZERO, &mut emit, 4), 0);
        // A job queued after the count was read is run next round.
        remote
            .submit(Box::new(|v: &mut Vec<u32>, _, _| v.push(6)))
            .unwrap();
        assert_eq!(inbox.run(&mut app, Instant::ZERO, &mut emit, 4), 1);
        assert_eq!(app.last(), Some(&6));
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_a_stopped_switch_says_so() {
        let (remote, inbox) = remote::<()>().unwrap();
        for _ in 0..QUEUE {
            remote.submit(Box::new(|_, _, _| {})).unwrap();
        }
        assert_eq!(
            remote.submit(Box::new(|_, _, _| {})),
            Err(RemoteError::Busy)
        );
        // A refused job is not counted.
        assert_eq!(inbox.queued.load(Ordering::Acquire), QUEUE);
        drop(inbox);
        assert_eq!(
            remote.submit(Box::new(|_, _, _| {})),
            Err(RemoteError::Stopped)
        );
    }
}
