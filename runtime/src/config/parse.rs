//! Parsing and checking the `HIPFILE_*` values: trimmed decimal counts and sizes, the
//! chunk size, the device and O_DIRECT names, hipFile's booleans, and the executors' CPUs
//! (`HIPFILE_THREADS`, `HIPFILE_CPUS` lists). Each failure is a [`ConfigError`] naming
//! the variable.

use std::collections::HashSet;
use std::ops::RangeInclusive;

use crate::file::DirectPolicy;

use super::{
    CHUNK_KB, CPUS, ConfigError, DEFAULT_CHUNK_KB, DEVICE, DeviceSelection, KIB, MAX_CHUNK_BYTES,
    MAX_EXECUTORS, MIB, MIN_CHUNK_BYTES, ODIRECT, REASON_CHUNK, REASON_CPUS_MANY, REASON_CPUS_MASK,
    REASON_CPUS_SYNTAX, REASON_CPUS_TWICE, REASON_DEVICE, REASON_NO_CPU, REASON_ODIRECT,
    REASON_THREADS, THREADS, default_executor_count,
};

/// `Ok` when `ok()` holds, else the error for `variable=value`.
pub(super) fn check(
    variable: &'static str,
    value: String,
    reason: &'static str,
    ok: impl FnOnce() -> bool,
) -> Result<(), ConfigError> {
    if ok() { Ok(()) } else { Err(ConfigError { variable, value, reason }) }
}

/// `bytes` in `unit`s when a whole number of them, else `"<bytes> bytes"`.
pub(super) fn in_unit(bytes: usize, unit: usize) -> String {
    if bytes.is_multiple_of(unit) { (bytes / unit).to_string() } else { format!("{bytes} bytes") }
}

pub(super) fn chunk_ok(chunk_bytes: usize) -> bool {
    chunk_bytes.is_power_of_two() && (MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&chunk_bytes)
}

/// A trimmed decimal integer: digits only (no sign), no overflow.
fn parse_decimal(
    variable: &'static str,
    raw: &str,
    reason: &'static str,
) -> Result<u64, ConfigError> {
    let text = raw.trim();
    let error = || ConfigError { variable, value: text.to_owned(), reason };
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(error());
    }
    text.parse::<u64>().map_err(|_| error())
}

/// A count in `range`, `default` when unset.
pub(super) fn parse_count(
    variable: &'static str,
    raw: Option<String>,
    range: RangeInclusive<usize>,
    default: usize,
    reason: &'static str,
) -> Result<usize, ConfigError> {
    let Some(raw) = raw else { return Ok(default) };
    let value = parse_decimal(variable, &raw, reason)?;
    usize::try_from(value).ok().filter(|count| range.contains(count)).ok_or_else(|| ConfigError {
        variable,
        value: raw.trim().to_owned(),
        reason,
    })
}

/// A size in MiB of at least `min_mib`, in bytes (`checked_mul`); `default_mib` when
/// unset.
pub(super) fn parse_mib(
    variable: &'static str,
    raw: Option<String>,
    default_mib: usize,
    min_mib: u64,
    reason: &'static str,
) -> Result<usize, ConfigError> {
    let Some(raw) = raw else { return Ok(default_mib * MIB) };
    let mib = parse_decimal(variable, &raw, reason)?;
    usize::try_from(mib)
        .ok()
        .filter(|_| mib >= min_mib)
        .and_then(|mib| mib.checked_mul(MIB))
        .ok_or_else(|| ConfigError { variable, value: raw.trim().to_owned(), reason })
}

/// `HIPFILE_CHUNK_KB` in bytes.
pub(super) fn parse_chunk_bytes(raw: Option<String>) -> Result<usize, ConfigError> {
    let Some(raw) = raw else { return Ok(DEFAULT_CHUNK_KB * KIB) };
    let kib = parse_decimal(CHUNK_KB, &raw, REASON_CHUNK)?;
    usize::try_from(kib)
        .ok()
        .and_then(|kib| kib.checked_mul(KIB))
        .filter(|&bytes| chunk_ok(bytes))
        .ok_or_else(|| ConfigError {
            variable: CHUNK_KB,
            value: raw.trim().to_owned(),
            reason: REASON_CHUNK,
        })
}

/// One of `choices` by its exact name (trimmed), `default` when unset.
pub(super) fn parse_choice<T: Copy>(
    variable: &'static str,
    raw: Option<String>,
    choices: &[(&str, T)],
    default: T,
    reason: &'static str,
) -> Result<T, ConfigError> {
    parse_named(variable, raw, choices, default, reason, str::eq)
}

/// One of `choices` by a name that is `same` as the value (trimmed), `default` when unset.
fn parse_named<T: Copy>(
    variable: &'static str,
    raw: Option<String>,
    choices: &[(&str, T)],
    default: T,
    reason: &'static str,
    same: fn(&str, &str) -> bool,
) -> Result<T, ConfigError> {
    let Some(raw) = raw else { return Ok(default) };
    let text = raw.trim();
    choices
        .iter()
        .find(|(name, _)| same(name, text))
        .map(|&(_, value)| value)
        .ok_or_else(|| ConfigError { variable, value: text.to_owned(), reason })
}

/// Device and O_DIRECT policy names match in any case.
fn any_case(name: &str, value: &str) -> bool {
    name.eq_ignore_ascii_case(value)
}

pub(super) fn parse_device(raw: Option<String>) -> Result<DeviceSelection, ConfigError> {
    let choices = [
        ("auto", DeviceSelection::Auto),
        ("cpu", DeviceSelection::Cpu),
        ("cuda", DeviceSelection::Cuda),
        ("rocm", DeviceSelection::Rocm),
    ];
    parse_named(DEVICE, raw, &choices, DeviceSelection::Auto, REASON_DEVICE, any_case)
}

pub(super) fn parse_direct(raw: Option<String>) -> Result<DirectPolicy, ConfigError> {
    let choices =
        [("auto", DirectPolicy::Auto), ("on", DirectPolicy::On), ("off", DirectPolicy::Off)];
    parse_named(ODIRECT, raw, &choices, DirectPolicy::Auto, REASON_ODIRECT, any_case)
}

/// hipFile's `Environment::get<bool>`: `strcasecmp` against `true` and `false`, nothing
/// else (no trimming, no `1` / `yes`).
pub(super) fn parse_hipfile_bool(raw: Option<String>) -> Option<bool> {
    let raw = raw?;
    if raw.eq_ignore_ascii_case("true") {
        Some(true)
    } else if raw.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// The executors' CPUs from `HIPFILE_THREADS` and `HIPFILE_CPUS`.
pub(super) fn parse_executor_cpus(
    threads: Option<String>,
    cpus: Option<String>,
    usable_cpus: &[usize],
) -> Result<Vec<usize>, ConfigError> {
    let explicit = cpus.is_some();
    let pool = match cpus {
        Some(raw) => parse_cpu_list(&raw, usable_cpus)?,
        None => usable_cpus.to_vec(),
    };
    if pool.is_empty() {
        let value = String::new();
        return Err(ConfigError { variable: CPUS, value, reason: REASON_NO_CPU });
    }
    let default_count = if explicit { pool.len() } else { default_executor_count(pool.len()) };
    let count = parse_count(THREADS, threads, 1..=MAX_EXECUTORS, default_count, REASON_THREADS)?;
    Ok(pool.iter().copied().cycle().take(count).collect())
}

/// `0,2,4-7` → `[0, 2, 4, 5, 6, 7]`, in the order given; every CPU in `usable_cpus`,
/// none twice, at most [`MAX_EXECUTORS`].
fn parse_cpu_list(raw: &str, usable_cpus: &[usize]) -> Result<Vec<usize>, ConfigError> {
    let text = raw.trim();
    let error = |reason| ConfigError { variable: CPUS, value: text.to_owned(), reason };
    let usable: HashSet<usize> = usable_cpus.iter().copied().collect();
    let mut seen = HashSet::new();
    let mut cpus = Vec::new();
    for item in text.split(',') {
        let (first, last) = parse_cpu_range(item).ok_or_else(|| error(REASON_CPUS_SYNTAX))?;
        // Stops at the first bad CPU, so a huge range costs nothing.
        for cpu in first..=last {
            if !usable.contains(&cpu) {
                return Err(error(REASON_CPUS_MASK));
            }
            if !seen.insert(cpu) {
                return Err(error(REASON_CPUS_TWICE));
            }
            if cpus.len() == MAX_EXECUTORS {
                return Err(error(REASON_CPUS_MANY));
            }
            cpus.push(cpu);
        }
    }
    Ok(cpus)
}

/// `"4-7"` → `(4, 7)`, `"2"` → `(2, 2)`; `None` for bad syntax or a reversed range.
fn parse_cpu_range(item: &str) -> Option<(usize, usize)> {
    let number = |text: &str| {
        let text = text.trim();
        let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
        digits.then(|| text.parse::<usize>().ok()).flatten()
    };
    let (first, last) = match item.split_once('-') {
        Some((first, last)) => (number(first)?, number(last)?),
        None => (number(item)?, number(item)?),
    };
    (first <= last).then_some((first, last))
}
