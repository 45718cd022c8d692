//! The tool's error: a message for the user (the process then exits non-zero).

use std::fmt;

/// What went wrong, in words.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// Result with a [`Failure`].
pub type Result<T> = std::result::Result<T, Failure>;

/// Adds what was being done to an error.
pub trait Context<T> {
    /// `what: error`.
    fn ctx(self, what: impl fmt::Display) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Failure(format!("{what}: {e}")))
    }
}

/// A [`Failure`] from a message.
pub fn fail<T>(message: impl Into<String>) -> Result<T> {
    Err(Failure(message.into()))
}
