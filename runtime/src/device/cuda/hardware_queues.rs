//! How many hardware queues the streams of a CUDA context share
//! (`CUDA_DEVICE_MAX_CONNECTIONS`): who decided, and hipFile setting it before CUDA starts.

/// The CUDA variable that sets how many hardware queues a context's streams share.
pub(super) const MAX_CONNECTIONS_VARIABLE: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
/// CUDA's largest (and our) `CUDA_DEVICE_MAX_CONNECTIONS`; its default is 8.
const MAX_CONNECTIONS: &str = "32";

/// How many hardware queues the streams of a context share, and who decided.
///
/// CUDA maps a context's streams onto `CUDA_DEVICE_MAX_CONNECTIONS` hardware queues,
/// round-robin in creation order, and a stream blocked on a wait-value blocks the work
/// queued after it on its queue. The engine's copies run in a context of their own, so
/// this can no longer stall them; among the application's own streams, a stream held on
/// an async op still delays the streams that share its queue until the op completes (it
/// always completes). 32 queues make that sharing rarer, so hipFile sets the variable
/// when it starts CUDA itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum HardwareQueues {
    /// The application set `CUDA_DEVICE_MAX_CONNECTIONS` (its value).
    FromEnvironment(String),
    /// hipFile set it to 32 before CUDA started (`cuInit`).
    SetByHipfile,
    /// CUDA started (`cuInit`) before hipFile, with the variable unset: 8 queues.
    CudaStartedFirst,
}

impl HardwareQueues {
    /// One line for `hipfile-bench check` and reports.
    pub(super) fn describe(&self) -> String {
        match self {
            HardwareQueues::FromEnvironment(value) => {
                format!("{MAX_CONNECTIONS_VARIABLE}={value} (set by the application)")
            }
            HardwareQueues::SetByHipfile => format!(
                "{MAX_CONNECTIONS_VARIABLE}={MAX_CONNECTIONS} (set by hipFile before CUDA \
                 started; set the variable yourself to choose)"
            ),
            HardwareQueues::CudaStartedFirst => format!(
                "{MAX_CONNECTIONS_VARIABLE} unset when CUDA started: the application's \
                 streams share 8 hardware queues, so a stream held on an async op delays \
                 the others on its queue until the op completes"
            ),
        }
    }
}

/// Sets `CUDA_DEVICE_MAX_CONNECTIONS=32` for the contexts CUDA has yet to create.
pub(super) fn set_max_connections() -> HardwareQueues {
    // SAFETY: setenv races with a concurrent getenv or setenv on another thread. hipFile
    // calls this once, while opening its driver (an application's start-up), only when
    // the variable is unset and CUDA, which reads it in cuInit, has not started. An
    // application that cannot allow this sets the variable itself.
    unsafe { std::env::set_var(MAX_CONNECTIONS_VARIABLE, MAX_CONNECTIONS) };
    HardwareQueues::SetByHipfile
}
