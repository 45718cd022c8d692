//! Where each executor's jobs are, for the pending report of a stuck stream and for the
//! fan-out that follows the load (`HIPFILE_BUSY_FAN_OUT`): jobs posted that have not
//! reported yet (every executor kind), and on glommio executors jobs received and ended,
//! how many are now in each step, and the blocking calls (`off_reactor`) in flight. Cheap
//! enough to stay on: a relaxed atomic add per job and step.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A step of a job that awaits something; a job counts in one step at a time (or none,
/// between steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobStep {
    /// The first open of a file system on this executor: glommio's poll probe.
    Probe,
    /// Opening the job's file through glommio.
    Open,
    /// Reading the file and copying to the device.
    Read,
    /// Copying from the device and writing the file.
    Write,
    /// Waiting for the job's copies before its completion.
    Finish,
}

impl JobStep {
    const ALL: [JobStep; 5] =
        [JobStep::Probe, JobStep::Open, JobStep::Read, JobStep::Write, JobStep::Finish];

    fn name(self) -> &'static str {
        match self {
            JobStep::Probe => "probing the file system",
            JobStep::Open => "opening the file",
            JobStep::Read => "reading",
            JobStep::Write => "writing",
            JobStep::Finish => "waiting for copies",
        }
    }
}

/// One executor's counters.
#[derive(Debug, Default)]
pub(crate) struct ExecutorWatch {
    /// Jobs posted to the executor that have not reported yet ([`PostedJob`]), queued or
    /// running.
    posted_in_flight: AtomicU64,
    received: AtomicU64,
    ended: AtomicU64,
    in_step: [AtomicU64; JobStep::ALL.len()],
    blocking_started: AtomicU64,
    blocking_ended: AtomicU64,
}

impl ExecutorWatch {
    /// Counts a job posted to this executor until the returned token drops: the job's
    /// completion drops it just before it reports, on whichever executor kind ran it, or
    /// with the job if it never ran.
    pub(crate) fn job_posted(self: &Arc<Self>) -> PostedJob {
        self.posted_in_flight.fetch_add(1, Ordering::Relaxed);
        PostedJob { watch: Arc::clone(self) }
    }

    /// Jobs posted to this executor that have not reported yet, queued or running.
    pub(crate) fn jobs_in_flight(&self) -> u64 {
        self.posted_in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn job_received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn job_ended(&self) {
        self.ended.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a job in `step` until the guard drops.
    pub(crate) fn step(&self, step: JobStep) -> StepGuard<'_> {
        let counter = &self.in_step[step as usize];
        counter.fetch_add(1, Ordering::Relaxed);
        StepGuard { counter }
    }

    /// Counts a blocking call in flight until the guard drops.
    pub(crate) fn blocking_call(&self) -> BlockingCallGuard<'_> {
        self.blocking_started.fetch_add(1, Ordering::Relaxed);
        BlockingCallGuard { ended: &self.blocking_ended }
    }

    /// One line: `executor 0: 33 jobs received, 32 ended; now 1 probing the file
    /// system; blocking calls 1 started, 0 ended`.
    pub(crate) fn describe(&self, index: usize) -> String {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut line = format!(
            "executor {index}: {} job(s) in flight; {} received, {} ended",
            load(&self.posted_in_flight),
            load(&self.received),
            load(&self.ended)
        );
        let steps: Vec<String> = JobStep::ALL
            .iter()
            .filter(|&&step| load(&self.in_step[step as usize]) > 0)
            .map(|&step| format!("{} {}", load(&self.in_step[step as usize]), step.name()))
            .collect();
        if !steps.is_empty() {
            let _ = write!(line, "; now {}", steps.join(", "));
        }
        let _ = write!(
            line,
            "; blocking calls {} started, {} ended",
            load(&self.blocking_started),
            load(&self.blocking_ended)
        );
        line
    }
}

/// A job's place in its executor's count of jobs in flight, given back on drop.
#[derive(Debug)]
pub(crate) struct PostedJob {
    watch: Arc<ExecutorWatch>,
}

impl Drop for PostedJob {
    fn drop(&mut self) {
        self.watch.posted_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) struct StepGuard<'a> {
    counter: &'a AtomicU64,
}

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) struct BlockingCallGuard<'a> {
    ended: &'a AtomicU64,
}

impl Drop for BlockingCallGuard<'_> {
    fn drop(&mut self) {
        self.ended.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_counts_in_its_step_until_the_guard_drops() {
        let watch = Arc::new(ExecutorWatch::default());
        let posted = watch.job_posted();
        watch.job_received();
        let probe = watch.step(JobStep::Probe);
        let call = watch.blocking_call();
        assert_eq!(
            watch.describe(3),
            "executor 3: 1 job(s) in flight; 1 received, 0 ended; now 1 probing the file system; \
             blocking calls 1 started, 0 ended"
        );
        drop(call);
        drop(probe);
        watch.job_ended();
        drop(posted);
        assert_eq!(watch.jobs_in_flight(), 0);
        assert_eq!(
            watch.describe(3),
            "executor 3: 0 job(s) in flight; 1 received, 1 ended; blocking calls 1 started, 1 ended"
        );
    }
}
