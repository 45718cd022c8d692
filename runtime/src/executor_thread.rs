//! Which threads are the engine's executors. The engine names them; the device layer
//! (CUDA keeps the engine context current on executors only) and an async op's last
//! drop ask. It sits below both, so that the device layer does not import the engine.

/// Executor threads are named with this prefix and their index.
pub(crate) const EXECUTOR_THREAD_PREFIX: &str = "hipfile-io-";

/// Whether the calling thread is one of the engine's executors.
pub(crate) fn on_executor_thread() -> bool {
    std::thread::current().name().is_some_and(|name| name.starts_with(EXECUTOR_THREAD_PREFIX))
}
