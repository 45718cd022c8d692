//! Seeded fault injection, for tests only: nothing is injected unless a test installs a
//! [`Plan`], and then only at the sites it names.
//!
//! Sites sit behind the I/O layer (every `pread`/`pwrite` of the library, each engine
//! chunk read and write through io_uring), at the library's calls into the device layer
//! (engine and caller-thread copies, events, pinned allocations: the same on every
//! backend, so the GPU suite runs the same plans), at the engine's start and between a
//! prefetch's gate and its jobs. Whether the k-th call at a site fails is a function of
//! the plan's seed, the site and k alone, so a plan replays the same faults for the same
//! sequence of calls at each site.
//!
//! The check at a site is one relaxed atomic load while no plan is installed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Where a fault can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Site {
    /// One `pread` of [`crate::file::pread_full`] (caller-thread requests, blocking
    /// executors, io_uring fallbacks).
    FileRead,
    /// One `pwrite` of [`crate::file::pwrite_full`].
    FileWrite,
    /// One engine chunk read through io_uring: an errno stands for io_uring's answer
    /// (EINVAL or EOPNOTSUPP: io_uring refuses the file, and blocking I/O takes over);
    /// [`Fault::Short`] keeps the first half of what it read (a short read before EOF).
    ChunkRead,
    /// One engine chunk write through io_uring: an errno stands for io_uring's answer, as
    /// at [`Site::ChunkRead`].
    ChunkWrite,
    /// A device copy the library asks for (engine streams and caller-thread copies); the
    /// copy is not enqueued.
    DeviceCopy,
    /// An event the engine records after a copy (the copy was enqueued).
    DeviceEvent,
    /// A pinned host allocation of the library (staging fallback, release words).
    PinnedAlloc,
    /// The start of one glommio executor (it is then replaced by a blocking one).
    ExecutorStart,
    /// The wait-value half of an async op's doorbell arm: reported as not queued after
    /// the doorbell write was (a [`Fault::Delay`] reports it that much later, after the
    /// stream may have reached the op). The wait is in fact queued; the library's
    /// recovery (the arm releases the word) lets the stream go on.
    StreamWait,
    /// Between a prefetch's gate and the posting of its jobs (a fully FIXED read that
    /// prefetches, at submission or deferred): only [`Fault::Delay`] has meaning here —
    /// the jobs are posted that much later, while the executors' loads may change; any
    /// other fault passes.
    PrefetchPost,
}

const SITES: usize = 10;

impl Site {
    fn index(self) -> usize {
        self as usize
    }
}

/// What happens at a site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The call fails with this errno (I/O sites), or the device call fails (device
    /// sites: `errno` is ignored and the device reports an error).
    Errno(i32),
    /// The I/O call moves only half of what it was asked, in whole pages (all of it
    /// when that is less than two pages).
    Short,
    /// The I/O call is interrupted (`EINTR`) before moving anything.
    Interrupt,
    /// The call goes on as if no rule fired: a rule of this fault with `limit` n ahead of
    /// another rule of the same site lets the site's first n calls through.
    Pass,
    /// The call completes this much later.
    Delay(Duration),
}

/// One rule of a plan: at `site`, `fault` for about one call in `one_in`, at most
/// `limit` times.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub site: Site,
    pub fault: Fault,
    /// 1: every call (up to `limit`).
    pub one_in: u32,
    pub limit: u64,
}

/// A seeded set of rules.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub seed: u64,
    pub rules: Vec<Rule>,
}

struct Installed {
    plan: Plan,
    calls: [u64; SITES],
    injected: Vec<u64>,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static INSTALLED: Mutex<Option<Installed>> = Mutex::new(None);

fn installed() -> MutexGuard<'static, Option<Installed>> {
    INSTALLED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Installs `plan` for the process until the guard drops (one plan at a time: tests
/// that inject faults run one after the other).
pub fn install(plan: Plan) -> PlanGuard {
    *installed() = Some(Installed::new(plan));
    ACTIVE.store(true, Ordering::SeqCst);
    PlanGuard(())
}

/// Keeps a plan installed; dropping it stops all injection.
#[must_use = "the plan is removed when the guard drops"]
pub struct PlanGuard(());

impl PlanGuard {
    /// Faults injected by each rule of the plan so far.
    pub fn injected(&self) -> Vec<u64> {
        installed().as_ref().map(|i| i.injected.clone()).unwrap_or_default()
    }
}

impl Drop for PlanGuard {
    fn drop(&mut self) {
        ACTIVE.store(false, Ordering::SeqCst);
        *installed() = None;
    }
}

/// The fault for this call at `site`, if the installed plan has one (device-layer
/// sites: `device::injected_fault` turns it into a device error).
pub(crate) fn at(site: Site) -> Option<Fault> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    match installed().as_mut()?.decide(site) {
        Some(Fault::Pass) => None,
        fault => fault,
    }
}

impl Installed {
    fn new(plan: Plan) -> Installed {
        let injected = vec![0; plan.rules.len()];
        Installed { plan, calls: [0; SITES], injected }
    }

    /// Counts the call at `site` and returns the fault of the first rule that fires.
    fn decide(&mut self, site: Site) -> Option<Fault> {
        let call = self.calls[site.index()];
        self.calls[site.index()] += 1;
        let seed = self.plan.seed;
        for (index, rule) in self.plan.rules.iter().enumerate() {
            if rule.site != site || self.injected[index] >= rule.limit {
                continue;
            }
            let draw = mix(seed ^ mix(site.index() as u64 + 1) ^ mix(call ^ (index as u64) << 48));
            if rule.one_in <= 1 || draw.is_multiple_of(u64::from(rule.one_in)) {
                self.injected[index] += 1;
                return Some(rule.fault);
            }
        }
        None
    }
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The unit tests use a local `Installed`: a global plan would reach the other unit
    // tests of the crate running at the same time.

    #[test]
    fn a_plan_replays_its_faults_and_names_only_its_sites() {
        let plan = Plan {
            seed: 7,
            rules: vec![Rule { site: Site::FileRead, fault: Fault::Short, one_in: 3, limit: 100 }],
        };
        let run = || {
            let mut installed = Installed::new(plan.clone());
            let hits: Vec<bool> =
                (0..60).map(|_| installed.decide(Site::FileRead).is_some()).collect();
            assert_eq!(installed.decide(Site::FileWrite), None, "only the sites the plan names");
            (hits, installed.injected[0])
        };
        let (first, injected) = run();
        assert_eq!(first, run().0, "same seed, same faults");
        assert!((5..=40).contains(&injected), "about one in three: {injected}");
        assert_eq!(at(Site::FileRead), None, "no plan installed");
    }

    #[test]
    fn a_limit_bounds_the_faults() {
        let mut installed = Installed::new(Plan {
            seed: 1,
            rules: vec![Rule {
                site: Site::ChunkRead,
                fault: Fault::Errno(5),
                one_in: 1,
                limit: 2,
            }],
        });
        let hits = (0..10).filter(|_| installed.decide(Site::ChunkRead).is_some()).count();
        assert_eq!((hits, installed.injected.clone()), (2, vec![2]));
    }
}
