//! The library's messages go through the [`log`] facade: an application embedding the
//! runtime routes them into its own logger. Programs without one — C programs through
//! `libhipfile`, `hipfile-bench` — get [`install_stderr_logger`]: one line per message on
//! stderr (`hipfile: warning: ...`), at the level `HIPFILE_LOG` names (`off`, `error`,
//! `warn` — the default —, `info`, `debug`, `trace`). The level can change later through
//! hipFile's `LoggingLevel` parameter ([`crate::parameters::StringParameter::LoggingLevel`]).

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The variable that sets the level of the stderr logger.
pub(crate) const LOG_VARIABLE: &str = "HIPFILE_LOG";

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        eprintln!("hipfile: {level}: {}", record.args());
    }

    fn flush(&self) {}
}

/// A level by name (any case: `off`, `error`, `warn`/`warning`, `info`, `debug`,
/// `trace`), or `None`.
pub(crate) fn parse_level(name: &str) -> Option<LevelFilter> {
    match name.trim().to_ascii_lowercase().as_str() {
        "warning" => Some(LevelFilter::Warn),
        other => other.parse().ok(),
    }
}

/// Installs the stderr logger unless the process has a logger already, with the level
/// of `HIPFILE_LOG` (default `warn`; an unknown value warns and keeps it). Idempotent.
pub fn install_stderr_logger() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(install);
}

fn install() {
    static LOGGER: StderrLogger = StderrLogger;
    if log::set_logger(&LOGGER).is_err() {
        return;
    }
    let configured = std::env::var(LOG_VARIABLE).ok();
    let level = configured.as_deref().map_or(Some(LevelFilter::Warn), parse_level);
    log::set_max_level(level.unwrap_or(LevelFilter::Warn));
    if level.is_none() {
        let value = configured.unwrap_or_default();
        log::warn!("{LOG_VARIABLE}={value:?} is not a level; using warn");
    }
}

/// The level in force, as hipFile's `LoggingLevel` parameter shows it (`OFF`, `ERROR`,
/// `WARN`, `INFO`, `DEBUG`, `TRACE`).
pub(crate) fn level_name() -> &'static str {
    match log::max_level() {
        LevelFilter::Off => "OFF",
        LevelFilter::Error => "ERROR",
        LevelFilter::Warn => "WARN",
        LevelFilter::Info => "INFO",
        LevelFilter::Debug => "DEBUG",
        LevelFilter::Trace => "TRACE",
    }
}

/// Sets the level of the library's messages (any logger: the filter is `log`'s
/// process-wide maximum).
///
/// # Errors
/// `InvalidValue` when the name is not a level (nothing changes).
pub(crate) fn set_level(name: &str) -> Result<(), crate::error::Error> {
    let level = parse_level(name)
        .ok_or_else(|| crate::error::Error::new(hipfile_core::OpError::InvalidValue))?;
    log::set_max_level(level);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_any_case() {
        assert_eq!(parse_level("WARN"), Some(LevelFilter::Warn));
        assert_eq!(parse_level(" warning "), Some(LevelFilter::Warn));
        assert_eq!(parse_level("off"), Some(LevelFilter::Off));
        assert_eq!(parse_level("Trace"), Some(LevelFilter::Trace));
        assert_eq!(parse_level("loud"), None);
        assert_eq!(parse_level(""), None);
    }
}
