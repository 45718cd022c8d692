//! An executor's job queue: a bounded channel, and an overflow list for the jobs that
//! executors post to a full channel.
//!
//! Foreign threads (callers, the arm poller, device callback threads) block on a full
//! channel: that is the engine's backpressure. They are never blocked forever: every
//! executor drains its channel whatever its jobs wait for (a glommio executor turns each
//! job into a task at once; a blocking one parks jobs waiting for their stream in a list
//! and runs the others, which wait only for the engine's own copies and staging), so an
//! executor never waits for a thread blocked here, the arm poller included.
//!
//! An executor must not block on a full channel: it may be the one that has to drain it
//! (its own queue), or its peer may be blocked posting to it. It also spawns no thread:
//! a job it posts to a full channel goes to the target executor's overflow list, which
//! that executor takes before it receives from its channel.
//!
//! The overflow list is bounded by the ops alive: executors post only the jobs of a
//! deferred prefetch started when an earlier op of the stream ends
//! (`StreamState::start_deferred`), each op's prefetch starts at most once (its op
//! gate), and it posts at most one job per part (`Engine::parts`, at most
//! `request_parallelism`). Each entry is a job (a few hundred bytes) of a live op,
//! which the application bounds by what it submits, as the op itself already is.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::IoJob;

/// Capacity of each executor's job channel: foreign senders block (backpressure)
/// beyond it.
///
/// Public for the integration tests; embedders do not need it.
pub const JOB_QUEUE_CAPACITY: usize = 1024;

/// What travels on an executor's channel.
enum Request {
    Io(IoJob),
    /// Drop cached descriptors of files whose handles are gone.
    Prune,
    /// Jobs wait in the overflow list (sent when the channel had room for the notice).
    Overflowed,
}

/// What an executor is asked to do.
pub(super) enum Received {
    /// Run a job.
    Io(IoJob),
    /// Drop cached descriptors of files whose handles are gone.
    Prune,
}

/// Jobs posted by executors while the channel was full.
#[derive(Default)]
struct Overflow {
    jobs: Mutex<VecDeque<IoJob>>,
    /// Whether `jobs` may hold any (read without the lock on every receive).
    pending: AtomicBool,
}

impl Overflow {
    fn lock(&self) -> MutexGuard<'_, VecDeque<IoJob>> {
        self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A new queue: the side the engine posts to and the side its executor takes from.
pub(super) fn job_queue() -> (JobSender, JobReceiver) {
    let (sender, receiver) = flume::bounded(JOB_QUEUE_CAPACITY);
    let overflow = Arc::new(Overflow::default());
    (JobSender { sender, overflow: Arc::clone(&overflow) }, JobReceiver { receiver, overflow })
}

/// The posting side of an executor's queue.
pub(super) struct JobSender {
    sender: flume::Sender<Request>,
    overflow: Arc<Overflow>,
}

impl JobSender {
    /// Queues `job`. A foreign thread (`from_executor` false) blocks while the channel
    /// is full; an executor puts the job in the overflow list instead. When the executor
    /// is gone (it panicked), the job is dropped, which runs its completion with
    /// `hipFileInternalError`, so nothing waits for it.
    pub(super) fn post(&self, job: IoJob, from_executor: bool) {
        let request = match self.sender.try_send(Request::Io(job)) {
            Ok(()) | Err(flume::TrySendError::Disconnected(_)) => return,
            Err(flume::TrySendError::Full(request)) => request,
        };
        if !from_executor {
            let _ = self.sender.send(request);
            return;
        }
        let Request::Io(job) = request else { return };
        {
            let mut jobs = self.overflow.lock();
            jobs.push_back(job);
            self.overflow.pending.store(true, Ordering::SeqCst);
        }
        // The notice wakes an executor parked on an empty channel. When the channel is
        // full the executor receives one of the requests in it after this point, and
        // takes the overflow before its next receive: no notice needed.
        if let Err(flume::TrySendError::Disconnected(_)) = self.sender.try_send(Request::Overflowed)
        {
            drop(std::mem::take(&mut *self.overflow.lock()));
        }
    }

    /// Asks the executor to drop cached descriptors of closed files; skipped when the
    /// channel is full (the next prune does it).
    pub(super) fn prune(&self) {
        let _ = self.sender.try_send(Request::Prune);
    }
}

/// The executor's side of its queue.
pub(super) struct JobReceiver {
    receiver: flume::Receiver<Request>,
    overflow: Arc<Overflow>,
}

impl JobReceiver {
    /// The next request, awaiting the channel (glommio executors); `None` once the
    /// engine stopped and nothing is left.
    pub(super) async fn recv_async(&self) -> Option<Received> {
        loop {
            if let Some(job) = self.take_overflowed() {
                return Some(Received::Io(job));
            }
            match self.receiver.recv_async().await {
                Ok(Request::Overflowed) => continue,
                Ok(Request::Io(job)) => return Some(Received::Io(job)),
                Ok(Request::Prune) => return Some(Received::Prune),
                Err(flume::RecvError::Disconnected) => return self.last_overflowed(),
            }
        }
    }

    /// The next request, blocking up to `timeout` (`None`: without limit) for the
    /// channel (blocking executors). `Err(true)` once the engine stopped and nothing is
    /// left; `Err(false)` when the time ran out.
    pub(super) fn recv_timeout(
        &self,
        timeout: Option<std::time::Duration>,
    ) -> Result<Received, bool> {
        loop {
            if let Some(job) = self.take_overflowed() {
                return Ok(Received::Io(job));
            }
            let received = match timeout {
                None => self.receiver.recv().map_err(|_| flume::RecvTimeoutError::Disconnected),
                Some(timeout) => self.receiver.recv_timeout(timeout),
            };
            match received {
                Ok(Request::Overflowed) => continue,
                Ok(Request::Io(job)) => return Ok(Received::Io(job)),
                Ok(Request::Prune) => return Ok(Received::Prune),
                Err(flume::RecvTimeoutError::Timeout) => return Err(false),
                Err(flume::RecvTimeoutError::Disconnected) => {
                    return self.last_overflowed().ok_or(true);
                }
            }
        }
    }

    fn take_overflowed(&self) -> Option<IoJob> {
        if !self.overflow.pending.load(Ordering::SeqCst) {
            return None;
        }
        let mut jobs = self.overflow.lock();
        let job = jobs.pop_front();
        if jobs.is_empty() {
            self.overflow.pending.store(false, Ordering::SeqCst);
        }
        job
    }

    /// After the channel closed: a job still in the overflow list, if any.
    fn last_overflowed(&self) -> Option<Received> {
        self.overflow.lock().pop_front().map(Received::Io)
    }
}
