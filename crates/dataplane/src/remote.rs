//! Calls into the switch from other threads: the control API's way in.
//!
//! The switch belongs to the thread that forwards; nothing else holds a lock on it. Another
//! thread hands a [`Job`] to a [`Remote`]; the run loop wakes, runs a bounded number of jobs
//! between batches of frames, and goes on forwarding. A caller never blocks the loop: a full
//! queue refuses the job at once, and the job itself says how its answer gets back.

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
}

impl<D> Clone for Remote<D> {
    fn clone(&self) -> Self {
        Remote {
            tx: self.tx.clone(),
            waker: self.waker.clone(),
        }
    }
}

/// The receiving side, handed to [`Driver::run`](crate::Driver::run).
pub struct Inbox<D> {
    rx: Receiver<Job<D>>,
    waker: Arc<Waker>,
}

/// A connected pair. Fails only if an eventfd cannot be created.
pub fn remote<D>() -> std::io::Result<(Remote<D>, Inbox<D>)> {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let waker = Arc::new(Waker::new()?);
    Ok((
        Remote {
            tx,
            waker: waker.clone(),
        },
        Inbox { rx, waker },
    ))
}

impl<D> Remote<D> {
    /// Queues `job` and wakes the loop.
    pub fn submit(&self, job: Job<D>) -> Result<(), RemoteError> {
        match self.tx.try_send(job) {
            Ok(()) => {
                // A failed wake only delays the job to the loop's next timeout.
                let _ = self.waker.wake();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(RemoteError::Busy),
            Err(TrySendError::Disconnected(_)) => Err(RemoteError::Stopped),
        }
    }
}

impl<D> Inbox<D> {
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.waker.fd()
    }

    /// Runs up to `max` waiting jobs; returns how many ran. Leaves the waker set while jobs
    /// remain, so the loop comes back for them without sleeping.
    pub fn run(&self, app: &mut D, now: Instant, emit: &mut Vec<Emit>, max: usize) -> usize {
        let _ = self.waker.reset();
        let mut ran = 0;
        while ran < max {
            match self.rx.try_recv() {
                Ok(job) => {
                    job(app, now, emit);
                    ran += 1;
                }
                Err(_) => return ran,
            }
        }
        let _ = self.waker.wake();
        ran
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
        drop(inbox);
        assert_eq!(
            remote.submit(Box::new(|_, _, _| {})),
            Err(RemoteError::Stopped)
        );
    }
}
