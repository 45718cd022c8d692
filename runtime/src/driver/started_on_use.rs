//! Parts of the driver started on first use (the engine, the arm poller), whose failed
//! start a later call tries again.

use std::sync::{Mutex, OnceLock};

/// A part of the driver started on first use, whose failed start a later call tries
/// again (at most every [`StartedOnUse::RETRY_INTERVAL`]; calls in between fail at once
/// with the last reason). Each new reason is printed once.
pub(crate) struct StartedOnUse<T> {
    value: OnceLock<T>,
    /// Serializes starts; the last failure and when it happened.
    attempt: Mutex<Option<(std::time::Instant, String)>>,
}

impl<T> Default for StartedOnUse<T> {
    fn default() -> StartedOnUse<T> {
        StartedOnUse { value: OnceLock::new(), attempt: Mutex::new(None) }
    }
}

impl<T> StartedOnUse<T> {
    /// The shortest time between two start attempts.
    pub(crate) const RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

    /// The value, if it started.
    pub(crate) fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// Why the last start failed, while it has not started.
    pub(crate) fn last_failure(&self) -> Option<String> {
        if self.value.get().is_some() {
            return None;
        }
        let attempt = self.attempt.lock().unwrap_or_else(|p| p.into_inner());
        attempt.as_ref().map(|(_, reason)| reason.clone())
    }

    /// The value, started by `start` unless it is running or failed less than
    /// [`StartedOnUse::RETRY_INTERVAL`] ago.
    pub(crate) fn get_or_start(
        &self,
        start: impl FnOnce() -> Result<T, String>,
    ) -> Result<&T, String> {
        if let Some(value) = self.value.get() {
            return Ok(value);
        }
        let mut attempt = self.attempt.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(value) = self.value.get() {
            return Ok(value);
        }
        if let Some((at, reason)) = attempt.as_ref()
            && at.elapsed() < Self::RETRY_INTERVAL
        {
            return Err(reason.clone());
        }
        match start() {
            Ok(value) => {
                *attempt = None;
                Ok(self.value.get_or_init(|| value))
            }
            Err(reason) => {
                let repeated = attempt.as_ref().is_some_and(|(_, last)| *last == reason);
                if !repeated {
                    log::error!("{reason} (tried again by a later call)");
                }
                *attempt = Some((std::time::Instant::now(), reason.clone()));
                Err(reason)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StartedOnUse;

    #[test]
    fn a_failed_start_is_tried_again_after_the_interval_and_then_kept() {
        let part = StartedOnUse::<u32>::default();
        assert_eq!(part.get_or_start(|| Err("no threads".into())), Err("no threads".into()));
        assert_eq!(part.last_failure().as_deref(), Some("no threads"));
        // Within the interval: the last reason, without a new attempt.
        assert_eq!(
            part.get_or_start(|| panic!("no attempt within the interval")),
            Err("no threads".into())
        );
        std::thread::sleep(StartedOnUse::<u32>::RETRY_INTERVAL);
        assert_eq!(part.get_or_start(|| Ok(7)), Ok(&7));
        assert_eq!(part.get_or_start(|| panic!("started already")), Ok(&7));
        assert_eq!(part.get(), Some(&7));
        assert_eq!(part.last_failure(), None);
    }
}
