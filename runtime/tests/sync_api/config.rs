//! Integration tests of `hipfile_runtime::config`: defaults, parsing of every
//! `HIPFILE_*` variable, rejection of invalid values (naming the variable), CPU lists,
//! relations between fields and hipFile's bool parsing.
//!
//! Tests never touch the process environment: they go through `Config::from_lookup*`.

use std::cell::RefCell;
use std::collections::BTreeSet;

use hipfile_runtime::config::{
    BufferedWrites, CallerThread, Config, ConfigError, DEFAULT_MAX_EXECUTORS, DeviceSelection,
    ENV_VARS, MAX_EXECUTORS, StreamCopies, default_executor_count, usable_cpus,
};
use hipfile_runtime::file::DirectPolicy;
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// A lookup over `pairs` (everything else unset).
fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let pairs: Vec<(String, String)> =
        pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
    move |name| pairs.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone())
}

/// `0..count` as a CPU list.
fn cpus(count: usize) -> Vec<usize> {
    (0..count).collect()
}

fn parse(pairs: &[(&str, &str)], usable: &[usize]) -> Result<Config, ConfigError> {
    Config::from_lookup_with_cpus(env(pairs), usable)
}

fn parse_ok(pairs: &[(&str, &str)]) -> Config {
    parse(pairs, &cpus(4)).unwrap_or_else(|error| panic!("{pairs:?}: {error}"))
}

/// Asserts that `pairs` is rejected for `variable`, and returns the error.
fn rejected(pairs: &[(&str, &str)], usable: &[usize], variable: &str) -> ConfigError {
    let error = parse(pairs, usable).expect_err(&format!("{pairs:?} should be rejected"));
    assert_eq!(error.variable, variable, "{pairs:?}: {error}");
    let message = error.to_string();
    assert!(message.starts_with(&format!("{variable}=")), "{message}");
    assert!(message.contains(": ") && !error.reason.is_empty(), "{message}");
    error
}

#[test]
fn defaults() {
    let config = parse_ok(&[]);
    assert_eq!(config.device, DeviceSelection::Auto);
    assert_eq!(config.executor_cpus, vec![0, 1, 2, 3]);
    assert_eq!(config.executor_count(), 4);
    assert_eq!(config.staging_chunk_bytes, MIB);
    assert_eq!(config.staging_per_executor_bytes, 32 * MIB);
    assert_eq!(config.pinned_fallback_cap_bytes, 16 * MIB);
    assert_eq!(config.direct, DirectPolicy::Auto);
    assert_eq!(config.request_parallelism, 4);
    assert_eq!(config.chunks_in_flight, 4);
    assert_eq!(config.cpu_device_count, 1);
    assert!(config.allow_compat_mode);
    assert_eq!(config.pinned_cap_bytes(), 4 * 32 * MIB + 16 * MIB);
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn default_matches_an_empty_environment_and_the_affinity_mask() {
    let config = Config::default();
    assert_eq!(Config::from_lookup(|_| None), Ok(config.clone()));
    let usable = usable_cpus();
    let count = default_executor_count(usable.len());
    let expected: Vec<usize> = usable.iter().copied().take(count).collect();
    assert_eq!(config.executor_cpus, expected);
    assert_eq!(config.request_parallelism, expected.len());
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn empty_values_count_as_unset() {
    let pairs: Vec<(&str, &str)> = ENV_VARS.iter().map(|&(name, _)| (name, "  ")).collect();
    assert_eq!(parse(&pairs, &cpus(4)), parse(&[], &cpus(4)));
}

#[test]
fn default_executor_count_leaves_two_cpus_beyond_8_and_stops_at_16() {
    assert_eq!(DEFAULT_MAX_EXECUTORS, 16);
    let expected =
        [(1, 1), (2, 2), (8, 8), (9, 8), (10, 8), (12, 10), (16, 14), (18, 16), (64, 16)];
    for (usable, executors) in expected {
        assert_eq!(default_executor_count(usable), executors, "{usable} usable CPUs");
        let config = parse(&[], &cpus(usable)).expect("defaults");
        assert_eq!(config.executor_cpus, cpus(executors), "{usable} usable CPUs");
        assert_eq!(config.request_parallelism, executors);
    }
    let sparse: Vec<usize> = (1..40).step_by(2).collect();
    let config = parse(&[], &sparse).expect("defaults");
    assert_eq!(config.executor_cpus, sparse[..16].to_vec(), "the first usable CPUs, in order");
}

#[test]
fn threads_picks_the_first_cpus_and_reuses_them_round_robin() {
    let config = parse(&[("HIPFILE_THREADS", "3")], &cpus(16)).expect("3 threads");
    assert_eq!(config.executor_cpus, vec![0, 1, 2]);
    let config = parse(&[("HIPFILE_THREADS", "24")], &cpus(32)).expect("24 threads");
    assert_eq!(config.executor_cpus, cpus(24), "above the default cap when asked");
    let config = parse(&[("HIPFILE_THREADS", " 5 ")], &[4, 6]).expect("5 threads");
    assert_eq!(config.executor_cpus, vec![4, 6, 4, 6, 4]);
    assert_eq!(config.request_parallelism, 5);
    let config = parse(&[("HIPFILE_THREADS", "256")], &[0]).expect("256 threads");
    assert_eq!(config.executor_cpus, vec![0; MAX_EXECUTORS]);
}

#[test]
fn cpu_lists() {
    let usable = cpus(16);
    let list = |value: &str| parse(&[("HIPFILE_CPUS", value)], &usable).map(|c| c.executor_cpus);
    assert_eq!(list("0,2,4-7"), Ok(vec![0, 2, 4, 5, 6, 7]));
    assert_eq!(list(" 7 , 3-3, 1 - 2 "), Ok(vec![7, 3, 1, 2]), "order kept, spaces trimmed");
    assert_eq!(list("0-11"), Ok(cpus(12)), "an explicit list is not capped at 8");
    assert_eq!(list("15"), Ok(vec![15]));
    let config = parse(&[("HIPFILE_CPUS", "4-7"), ("HIPFILE_THREADS", "3")], &usable).unwrap();
    assert_eq!(config.executor_cpus, vec![4, 5, 6]);
    let config = parse(&[("HIPFILE_CPUS", "2,9"), ("HIPFILE_THREADS", "5")], &usable).unwrap();
    assert_eq!(config.executor_cpus, vec![2, 9, 2, 9, 2]);
}

#[test]
fn bad_cpu_lists_are_rejected() {
    let usable = [0, 1, 2, 3, 8];
    for bad in ["0,,2", "a", "3-1", "-1", "1-", "-", "0 2", "1.5", "+1", "0,", ",0", "0x1", "1-2-3"]
    {
        let error = rejected(&[("HIPFILE_CPUS", bad)], &usable, "HIPFILE_CPUS");
        assert_eq!(error.value, bad.trim());
        assert!(error.reason.contains("0,2,4-7"), "{error}");
    }
    for twice in ["0,0", "0-2,1", "8,8-8"] {
        let error = rejected(&[("HIPFILE_CPUS", twice)], &usable, "HIPFILE_CPUS");
        assert!(error.reason.contains("twice"), "{error}");
    }
    for outside in ["4", "0-4", "9", "0-18446744073709551615", "1023", "100000"] {
        let error = rejected(&[("HIPFILE_CPUS", outside)], &usable, "HIPFILE_CPUS");
        assert!(error.reason.contains("affinity mask"), "{error}");
    }
    let many = cpus(300);
    let error = rejected(&[("HIPFILE_CPUS", "0-299")], &many, "HIPFILE_CPUS");
    assert!(error.reason.contains("256"), "{error}");
    assert!(parse(&[("HIPFILE_CPUS", "0-255")], &many).is_ok());
}

#[test]
fn an_empty_cpu_pool_is_an_error() {
    let error = rejected(&[], &[], "HIPFILE_CPUS");
    assert!(error.reason.contains("no usable CPU"), "{error}");
}

#[test]
fn real_affinity_mask_is_respected() {
    let usable = usable_cpus();
    assert!(!usable.is_empty());
    assert!(usable.windows(2).all(|pair| pair[0] < pair[1]), "sorted, no duplicates");
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    if let Some(line) = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")) {
        let mut expected = Vec::new();
        for item in line.trim().split(',') {
            let (first, last) = item.split_once('-').unwrap_or((item, item));
            expected.extend(first.parse::<usize>().unwrap()..=last.parse::<usize>().unwrap());
        }
        assert_eq!(usable, expected, "usable_cpus() matches Cpus_allowed_list");
    }
    let outside = usable.last().unwrap() + 1;
    let value = outside.to_string();
    let error = Config::from_lookup(env(&[("HIPFILE_CPUS", &value)])).expect_err("outside");
    assert_eq!(error.variable, "HIPFILE_CPUS");
    let value = usable[0].to_string();
    let config = Config::from_lookup(env(&[("HIPFILE_CPUS", &value)])).expect("inside");
    assert_eq!(config.executor_cpus, vec![usable[0]]);
}

#[test]
fn each_variable_is_parsed() {
    let device = |value| parse_ok(&[("HIPFILE_DEVICE", value)]).device;
    assert_eq!(device("auto"), DeviceSelection::Auto);
    assert_eq!(device("cpu"), DeviceSelection::Cpu);
    assert_eq!(device(" CUDA "), DeviceSelection::Cuda);
    assert_eq!(device("Rocm"), DeviceSelection::Rocm);
    let direct = |value| parse_ok(&[("HIPFILE_ODIRECT", value)]).direct;
    assert_eq!(direct("auto"), DirectPolicy::Auto);
    assert_eq!(direct("on"), DirectPolicy::On);
    assert_eq!(direct("OFF"), DirectPolicy::Off);
    let chunk = |value| parse_ok(&[("HIPFILE_CHUNK_KB", value)]).staging_chunk_bytes;
    assert_eq!(chunk("4"), 4096);
    assert_eq!(chunk("256"), 256 << 10);
    assert_eq!(chunk(" 4096\n"), 4 * MIB);
    let config = parse_ok(&[("HIPFILE_CHUNK_KB", "65536"), ("HIPFILE_STAGING_MB", "128")]);
    assert_eq!(config.staging_chunk_bytes, 64 * MIB);
    assert_eq!(config.staging_per_executor_bytes, 128 * MIB);
    let config = parse_ok(&[("HIPFILE_STAGING_MB", "2"), ("HIPFILE_PINNED_FALLBACK_MB", "1")]);
    assert_eq!(config.staging_per_executor_bytes, 2 * MIB);
    assert_eq!(config.pinned_fallback_cap_bytes, MIB);
    assert_eq!(config.pinned_cap_bytes(), 4 * 2 * MIB + MIB);
    let error =
        rejected(&[("HIPFILE_PINNED_FALLBACK_MB", "0")], &cpus(4), "HIPFILE_PINNED_FALLBACK_MB");
    assert!(error.reason.contains("at least one chunk"), "{error}");
    let config = parse_ok(&[("HIPFILE_PINNED_FALLBACK_MB", "100")]);
    assert_eq!(config.pinned_fallback_cap_bytes, 100 * MIB);
    assert_eq!(parse_ok(&[("HIPFILE_REQUEST_PARALLELISM", "2")]).request_parallelism, 2);
    assert_eq!(parse_ok(&[("HIPFILE_REQUEST_PARALLELISM", "4")]).request_parallelism, 4);
    assert_eq!(parse_ok(&[("HIPFILE_QUEUE_DEPTH", "1")]).chunks_in_flight, 1);
    assert_eq!(parse_ok(&[("HIPFILE_QUEUE_DEPTH", "64")]).chunks_in_flight, 64);
    assert_eq!(parse_ok(&[]).copy_spin_us, 200);
    assert_eq!(parse_ok(&[("HIPFILE_COPY_SPIN_US", "0")]).copy_spin_us, 0);
    assert_eq!(parse_ok(&[("HIPFILE_COPY_SPIN_US", "10000")]).copy_spin_us, 10_000);
    assert_eq!(parse_ok(&[("HIPFILE_CPU_DEVICES", "16")]).cpu_device_count, 16);
    assert_eq!(parse_ok(&[("HIPFILE_CPU_DEVICES", "3")]).cpu_device_count, 3);
    assert!(!parse_ok(&[("HIPFILE_ALLOW_COMPAT_MODE", "false")]).allow_compat_mode);
    let config = parse_ok(&[("HIPFILE_THREADS", "2"), ("HIPFILE_REQUEST_PARALLELISM", "2")]);
    assert_eq!((config.executor_count(), config.request_parallelism), (2, 2));
    // Prefetch: 64 MiB or half the arenas, whichever is less, unless set; 0 turns it off.
    let config = parse_ok(&[("HIPFILE_THREADS", "2"), ("HIPFILE_STAGING_MB", "48")]);
    assert_eq!(config.prefetch_cap_bytes(), 48 * MIB);
    let config = parse_ok(&[("HIPFILE_THREADS", "16"), ("HIPFILE_STAGING_MB", "32")]);
    assert_eq!(config.prefetch_cap_bytes(), 64 * MIB);
    assert_eq!(config.prefetch_cap_bytes(), hipfile_runtime::config::DEFAULT_PREFETCH_CAP_BYTES);
    assert_eq!(parse_ok(&[("HIPFILE_PREFETCH_MB", "0")]).prefetch_cap_bytes(), 0);
    assert_eq!(parse_ok(&[("HIPFILE_PREFETCH_MB", "48")]).prefetch_cap_bytes(), 48 * MIB);
}

#[test]
fn invalid_values_are_rejected_naming_the_variable() {
    let cases: &[(&str, &[&str])] = &[
        ("HIPFILE_DEVICE", &["gpu", "cpu,cuda", "0", "autox"]),
        ("HIPFILE_ODIRECT", &["yes", "1", "true", "of"]),
        ("HIPFILE_THREADS", &["0", "-1", "257", "abc", "1.5", "+2", "1e3", "99999999999999999999"]),
        ("HIPFILE_CHUNK_KB", &["0", "2", "3000", "131072", "-4", "1k", "4.0", "1024KB"]),
        ("HIPFILE_STAGING_MB", &["0", "-32", "x", "32MB", "1", "99999999999999999999"]),
        ("HIPFILE_PINNED_FALLBACK_MB", &["-1", "lots", "1.5", "99999999999999999999"]),
        ("HIPFILE_REQUEST_PARALLELISM", &["0", "5", "-1", "all"]),
        ("HIPFILE_QUEUE_DEPTH", &["0", "65", "-4", "four", "4 4"]),
        ("HIPFILE_COPY_SPIN_US", &["10001", "-1", "spin", "2.5"]),
        ("HIPFILE_PREFETCH_MB", &["-1", "some", "2.5", "99999999999999999999"]),
        ("HIPFILE_CPU_DEVICES", &["0", "17", "-1", "one"]),
    ];
    for &(variable, values) in cases {
        for &value in values {
            let error = rejected(&[(variable, value)], &cpus(4), variable);
            assert_eq!(error.value, value.trim(), "{error}");
        }
    }
}

#[test]
fn error_display_is_variable_value_reason() {
    let error = rejected(&[("HIPFILE_CHUNK_KB", "3000")], &cpus(4), "HIPFILE_CHUNK_KB");
    assert_eq!(
        error.to_string(),
        "HIPFILE_CHUNK_KB=3000: must be a power of two between 4 and 65536"
    );
    let boxed: Box<dyn std::error::Error> = Box::new(error);
    assert!(boxed.to_string().starts_with("HIPFILE_CHUNK_KB=3000"));
}

#[test]
fn mib_sizes_overflowing_usize_are_rejected() {
    // Fits in u64, but × 2^20 does not fit in usize.
    let huge = (u64::MAX >> 19).to_string();
    rejected(&[("HIPFILE_STAGING_MB", &huge)], &cpus(4), "HIPFILE_STAGING_MB");
    rejected(&[("HIPFILE_PINNED_FALLBACK_MB", &huge)], &cpus(4), "HIPFILE_PINNED_FALLBACK_MB");
}

#[cfg(target_pointer_width = "64")]
#[test]
fn pinned_cap_overflow_is_rejected() {
    // 2^43 MiB = 2^63 bytes per executor fits in usize but in no machine's memory; two
    // executors do not fit in usize.
    let staging = (1u64 << 43).to_string();
    let pairs = [("HIPFILE_STAGING_MB", staging.as_str()), ("HIPFILE_PINNED_FALLBACK_MB", "1")];
    let error = rejected(&pairs, &[0], "HIPFILE_STAGING_MB");
    assert!(error.reason.contains("physical memory"), "{error}");
    let error = rejected(&[("HIPFILE_STAGING_MB", &staging)], &cpus(2), "HIPFILE_STAGING_MB");
    assert!(error.reason.contains("overflow"), "{error}");
}

#[test]
fn staging_must_hold_two_chunks() {
    let error = rejected(&[("HIPFILE_STAGING_MB", "1")], &cpus(4), "HIPFILE_STAGING_MB");
    assert_eq!(
        error.to_string(),
        "HIPFILE_STAGING_MB=1: must hold at least 2 chunks of HIPFILE_CHUNK_KB"
    );
    let config = parse_ok(&[("HIPFILE_STAGING_MB", "1"), ("HIPFILE_CHUNK_KB", "512")]);
    assert_eq!(config.staging_per_executor_bytes, 2 * config.staging_chunk_bytes);
    rejected(
        &[("HIPFILE_STAGING_MB", "127"), ("HIPFILE_CHUNK_KB", "65536")],
        &cpus(4),
        "HIPFILE_STAGING_MB",
    );
}

#[test]
fn busy_fan_out_is_off_unless_set_and_within_the_executors() {
    assert_eq!(parse_ok(&[]).busy_fan_out, None);
    assert_eq!(parse_ok(&[("HIPFILE_BUSY_FAN_OUT", "2")]).busy_fan_out, Some(2));
    assert_eq!(parse_ok(&[("HIPFILE_BUSY_FAN_OUT", "4")]).busy_fan_out, Some(4));
    for bad in ["0", "5", "-1", "x", "all"] {
        rejected(&[("HIPFILE_BUSY_FAN_OUT", bad)], &cpus(4), "HIPFILE_BUSY_FAN_OUT");
    }
    let config = parse_ok(&[("HIPFILE_THREADS", "2"), ("HIPFILE_BUSY_FAN_OUT", "2")]);
    assert_eq!(config.busy_fan_out, Some(2));
    rejected(
        &[("HIPFILE_THREADS", "2"), ("HIPFILE_BUSY_FAN_OUT", "3")],
        &cpus(4),
        "HIPFILE_BUSY_FAN_OUT",
    );
    let mut hand_built = parse_ok(&[]);
    hand_built.busy_fan_out = Some(0);
    assert_eq!(hand_built.validate().map_err(|error| error.variable), Err("HIPFILE_BUSY_FAN_OUT"));
}

#[test]
fn loaded_fan_out_is_two_parts_unless_off_and_within_the_executors() {
    let threads = |n: &'static str| ("HIPFILE_THREADS", n);
    assert_eq!(parse_ok(&[threads("4")]).loaded_fan_out, Some(2));
    // Not tied to the executor count (a request never has more parts than executors):
    // one executor keeps the default, and a cap past the executors is valid.
    assert_eq!(parse_ok(&[threads("1")]).loaded_fan_out, Some(2));
    assert_eq!(parse_ok(&[threads("1"), ("HIPFILE_LOADED_FAN_OUT", "8")]).loaded_fan_out, Some(8));
    assert_eq!(
        parse_ok(&[threads("4"), ("HIPFILE_LOADED_FAN_OUT", "256")]).loaded_fan_out,
        Some(256)
    );
    assert_eq!(parse_ok(&[threads("4"), ("HIPFILE_LOADED_FAN_OUT", "off")]).loaded_fan_out, None);
    assert_eq!(parse_ok(&[threads("4"), ("HIPFILE_LOADED_FAN_OUT", " OFF ")]).loaded_fan_out, None);
    assert_eq!(parse_ok(&[threads("4"), ("HIPFILE_LOADED_FAN_OUT", "4")]).loaded_fan_out, Some(4));
    assert_eq!(parse_ok(&[threads("4"), ("HIPFILE_LOADED_FAN_OUT", "1")]).loaded_fan_out, Some(1));
    for bad in ["0", "257", "-1", "x", "on"] {
        let pairs = [threads("4"), ("HIPFILE_LOADED_FAN_OUT", bad)];
        rejected(&pairs, &cpus(4), "HIPFILE_LOADED_FAN_OUT");
    }
    let mut hand_built = parse_ok(&[threads("4")]);
    hand_built.loaded_fan_out = Some(0);
    let variable = hand_built.validate().map_err(|error| error.variable);
    assert_eq!(variable, Err("HIPFILE_LOADED_FAN_OUT"));
}

#[test]
fn request_parallelism_follows_the_executor_count() {
    assert_eq!(parse_ok(&[("HIPFILE_THREADS", "3")]).request_parallelism, 3);
    let pairs = [("HIPFILE_THREADS", "3"), ("HIPFILE_REQUEST_PARALLELISM", "4")];
    rejected(&pairs, &cpus(4), "HIPFILE_REQUEST_PARALLELISM");
    let pairs = [("HIPFILE_CPUS", "1-2"), ("HIPFILE_REQUEST_PARALLELISM", "2")];
    assert_eq!(parse_ok(&pairs).request_parallelism, 2);
}

#[test]
fn compat_mode_bool_parses_like_hipfile() {
    let compat = |value: &str| parse_ok(&[("HIPFILE_ALLOW_COMPAT_MODE", value)]).allow_compat_mode;
    for value in ["false", "FALSE", "False", "fAlSe"] {
        assert!(!compat(value), "{value:?} is false");
    }
    for value in ["true", "TRUE", "True"] {
        assert!(compat(value), "{value:?} is true");
    }
    // Anything else is "unset": the default, true. No error either.
    for value in ["0", "no", "off", " false", "false ", "falsey", "f", ""] {
        assert!(compat(value), "{value:?} counts as unset");
    }
}

#[test]
fn validate_checks_hand_built_configs() {
    let good = parse_ok(&[]);
    let broken = |edit: &dyn Fn(&mut Config), variable: &str| {
        let mut config = good.clone();
        edit(&mut config);
        let error = config.validate().expect_err(variable);
        assert_eq!(error.variable, variable, "{error}");
        error
    };
    let error = broken(&|c| c.staging_chunk_bytes = 3000 * 1024, "HIPFILE_CHUNK_KB");
    assert_eq!(
        error.to_string(),
        "HIPFILE_CHUNK_KB=3000: must be a power of two between 4 and 65536"
    );
    let error = broken(&|c| c.staging_chunk_bytes = 5000, "HIPFILE_CHUNK_KB");
    assert_eq!(error.value, "5000 bytes");
    broken(&|c| c.staging_chunk_bytes = 2048, "HIPFILE_CHUNK_KB");
    broken(&|c| c.staging_chunk_bytes = 128 * MIB, "HIPFILE_CHUNK_KB");
    broken(&|c| c.staging_per_executor_bytes = MIB, "HIPFILE_STAGING_MB");
    broken(&|c| c.staging_per_executor_bytes = 0, "HIPFILE_STAGING_MB");
    broken(&|c| c.executor_cpus.clear(), "HIPFILE_THREADS");
    broken(&|c| c.executor_cpus = vec![0; MAX_EXECUTORS + 1], "HIPFILE_THREADS");
    broken(&|c| c.request_parallelism = 0, "HIPFILE_REQUEST_PARALLELISM");
    broken(&|c| c.request_parallelism = 5, "HIPFILE_REQUEST_PARALLELISM");
    broken(&|c| c.chunks_in_flight = 0, "HIPFILE_QUEUE_DEPTH");
    broken(&|c| c.chunks_in_flight = 65, "HIPFILE_QUEUE_DEPTH");
    broken(&|c| c.cpu_device_count = 0, "HIPFILE_CPU_DEVICES");
    broken(&|c| c.cpu_device_count = 17, "HIPFILE_CPU_DEVICES");
    let error = broken(&|c| c.pinned_fallback_cap_bytes = usize::MAX, "HIPFILE_STAGING_MB");
    assert!(error.reason.contains("overflow"), "{error}");
    let mut edge = good.clone();
    edge.staging_chunk_bytes = 4096;
    edge.staging_per_executor_bytes = 8192;
    edge.request_parallelism = 1;
    edge.chunks_in_flight = 64;
    edge.cpu_device_count = 16;
    assert_eq!(edge.validate(), Ok(()));
}

#[test]
fn env_vars_lists_exactly_the_variables_read() {
    let asked = RefCell::new(BTreeSet::new());
    let _ = Config::from_lookup_with_cpus(
        |name| {
            asked.borrow_mut().insert(name.to_owned());
            None
        },
        &cpus(2),
    );
    let listed: BTreeSet<String> = ENV_VARS.iter().map(|&(name, _)| name.to_owned()).collect();
    assert_eq!(asked.into_inner(), listed);
    assert_eq!(listed.len(), ENV_VARS.len(), "no duplicates");
    for &(name, description) in ENV_VARS {
        assert!(name.starts_with("HIPFILE_"), "{name}");
        assert!(description.contains("default"), "{name}: {description}");
        assert!(!description.contains('\n'), "{name}: one line");
    }
}

#[test]
fn global_is_read_once() {
    let first = Config::global();
    let second = Config::global();
    assert!(std::ptr::eq(first, second));
    assert_eq!(first.validate(), Ok(()));
    let from_env = Config::from_env().unwrap_or_default();
    assert_eq!(*first, from_env);
}

proptest! {
    #[test]
    fn chunk_kb_accepts_exactly_powers_of_two_from_4_to_65536(kib in 0u64..200_000) {
        let value = kib.to_string();
        let pairs = [("HIPFILE_CHUNK_KB", value.as_str()), ("HIPFILE_STAGING_MB", "128")];
        let valid = kib.is_power_of_two() && (4..=65536).contains(&kib);
        let result = parse(&pairs, &cpus(2));
        prop_assert_eq!(result.is_ok(), valid, "{}", value);
        if let Ok(config) = result {
            prop_assert_eq!(config.staging_chunk_bytes as u64, kib * 1024);
        }
    }

    #[test]
    fn queue_depth_accepts_exactly_1_to_64(depth in any::<i64>().prop_map(|n| n % 100)) {
        let value = depth.to_string();
        let result = parse(&[("HIPFILE_QUEUE_DEPTH", value.as_str())], &cpus(2));
        prop_assert_eq!(result.is_ok(), (1..=64).contains(&depth), "{}", value);
    }

    #[test]
    fn threads_gives_n_executors_from_the_pool(threads in 1usize..=256, pool in 1usize..20) {
        let value = threads.to_string();
        let config = parse(&[("HIPFILE_THREADS", value.as_str())], &cpus(pool)).unwrap();
        prop_assert_eq!(config.executor_count(), threads);
        for (index, &cpu) in config.executor_cpus.iter().enumerate() {
            prop_assert_eq!(cpu, index % pool);
        }
    }
}

#[test]
fn io_uring_can_be_turned_off() {
    assert!(parse_ok(&[]).use_io_uring);
    for on in ["1", "on", "true"] {
        assert!(parse_ok(&[("HIPFILE_IO_URING", on)]).use_io_uring, "{on}");
    }
    for off in ["0", "off", "false", " 0 "] {
        assert!(!parse_ok(&[("HIPFILE_IO_URING", off)]).use_io_uring, "{off}");
    }
    rejected(&[("HIPFILE_IO_URING", "maybe")], &cpus(4), "HIPFILE_IO_URING");
}

#[test]
fn buffered_writes_take_a_thread_unless_io_uring_is_asked_for() {
    assert_eq!(parse_ok(&[]).buffered_writes, BufferedWrites::Thread);
    assert_eq!(
        parse_ok(&[("HIPFILE_BUFFERED_WRITES", " thread ")]).buffered_writes,
        BufferedWrites::Thread
    );
    assert_eq!(
        parse_ok(&[("HIPFILE_BUFFERED_WRITES", "io_uring")]).buffered_writes,
        BufferedWrites::IoUring
    );
    rejected(&[("HIPFILE_BUFFERED_WRITES", "uring")], &cpus(4), "HIPFILE_BUFFERED_WRITES");
}

#[test]
fn caller_thread_takes_small_requests_unless_busy_or_always_is_asked_for() {
    assert_eq!(parse_ok(&[]).caller_thread, CallerThread::Small);
    assert_eq!(
        parse_ok(&[("HIPFILE_CALLER_THREAD", " small ")]).caller_thread,
        CallerThread::Small
    );
    assert_eq!(parse_ok(&[("HIPFILE_CALLER_THREAD", "busy")]).caller_thread, CallerThread::Busy);
    assert_eq!(
        parse_ok(&[("HIPFILE_CALLER_THREAD", "always")]).caller_thread,
        CallerThread::Always
    );
    for value in ["Busy", "1", "on", "large", "busy,always"] {
        let error =
            rejected(&[("HIPFILE_CALLER_THREAD", value)], &cpus(4), "HIPFILE_CALLER_THREAD");
        assert_eq!(error.reason, "must be small, busy or always", "{error}");
    }
}

/// Under `busy` and `always` the fallback pool holds one chunk per executor on top of
/// `HIPFILE_PINNED_FALLBACK_MB` (what requests of many chunks on callers' threads leave to
/// the executors), and the pinned cap counts it.
#[test]
fn caller_thread_busy_or_always_adds_a_fallback_chunk_per_executor() {
    let base = [
        ("HIPFILE_THREADS", "4"),
        ("HIPFILE_CHUNK_KB", "512"),
        ("HIPFILE_PINNED_FALLBACK_MB", "8"),
    ];
    let small = parse_ok(&base);
    assert_eq!(small.fallback_pool_bytes(), 8 << 20);
    for value in ["busy", "always"] {
        let mut vars = base.to_vec();
        vars.push(("HIPFILE_CALLER_THREAD", value));
        let config = parse_ok(&vars);
        assert_eq!(config.pinned_fallback_cap_bytes, 8 << 20, "{value}: the cap as set");
        assert_eq!(config.fallback_pool_bytes(), (8 << 20) + 4 * (512 << 10), "{value}");
        assert_eq!(
            config.pinned_cap_bytes() - small.pinned_cap_bytes(),
            4 * (512 << 10),
            "{value}: counted in the pinned cap"
        );
    }
}

/// `HIPFILE_PARK_SPIN_US`: unset, executors poll 50 µs before they park where two cores
/// are left besides them and park at once elsewhere; set, the value everywhere.
#[test]
fn park_spin_follows_spare_cores_unless_set() {
    let four = parse_ok(&[("HIPFILE_THREADS", "4")]);
    assert_eq!(four.park_spin_us, None);
    assert_eq!(four.park_spin_us_on(6), 50, "two cores to spare");
    assert_eq!(four.park_spin_us_on(5), 0, "one core to spare");
    for (value, us) in [("0", 0), (" 120 ", 120), ("1000", 1000)] {
        let config = parse_ok(&[("HIPFILE_THREADS", "4"), ("HIPFILE_PARK_SPIN_US", value)]);
        assert_eq!(config.park_spin_us, Some(us), "{value}");
        assert_eq!((config.park_spin_us_on(64), config.park_spin_us_on(1)), (us, us), "{value}");
    }
    for value in ["1001", "-1", "50us"] {
        let error = rejected(&[("HIPFILE_PARK_SPIN_US", value)], &cpus(4), "HIPFILE_PARK_SPIN_US");
        assert_eq!(error.reason, "must be an integer between 0 and 1000", "{error}");
    }
}

#[test]
fn pinned_staging_beyond_physical_memory_is_refused() {
    // SAFETY: sysconf has no preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) } as u64;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let physical_mb = (pages * page) >> 20;
    let too_much = (physical_mb + 1).to_string();
    let error = rejected(
        &[("HIPFILE_STAGING_MB", &too_much), ("HIPFILE_THREADS", "1")],
        &cpus(4),
        "HIPFILE_STAGING_MB",
    );
    assert!(error.reason.contains("physical memory"), "{error}");
    // Within it: accepted.
    parse_ok(&[("HIPFILE_STAGING_MB", "64"), ("HIPFILE_THREADS", "1")]);
}

#[test]
fn stream_copies_are_the_backends_choice_unless_asked_for() {
    assert_eq!(parse_ok(&[]).stream_copies, StreamCopies::Auto);
    for on in ["1", "on", " true "] {
        let got = parse_ok(&[("HIPFILE_STREAM_COPIES", on)]).stream_copies;
        assert_eq!(got, StreamCopies::Idle, "{on:?}");
    }
    for off in ["0", "off", "false"] {
        let got = parse_ok(&[("HIPFILE_STREAM_COPIES", off)]).stream_copies;
        assert_eq!(got, StreamCopies::Off, "{off:?}");
    }
    let all = parse_ok(&[("HIPFILE_STREAM_COPIES", " all")]).stream_copies;
    assert_eq!(all, StreamCopies::All);
    for bad in ["yes", "ALL", "idle"] {
        rejected(&[("HIPFILE_STREAM_COPIES", bad)], &cpus(4), "HIPFILE_STREAM_COPIES");
    }
    // The cap of each large slot size: unless set, a 64th of the machine's memory in whole
    // 16 MiB slots, from 64 MiB to 1 GiB (the rule's values: the config module's unit
    // test); at least 16 when set.
    let default_cap = parse_ok(&[]).stream_copy_cap_bytes;
    assert!((64 << 20..=1 << 30).contains(&default_cap), "{default_cap}");
    assert_eq!(default_cap % (16 << 20), 0, "{default_cap}");
    assert_eq!(parse_ok(&[("HIPFILE_STREAM_COPY_MB", "256")]).stream_copy_cap_bytes, 256 << 20);
    for bad in ["8", "-1", "lots"] {
        rejected(&[("HIPFILE_STREAM_COPY_MB", bad)], &cpus(4), "HIPFILE_STREAM_COPY_MB");
    }
    // The pieces of long ops: a slot size of 1, 4 or 16 MiB, 16 unless set.
    assert_eq!(parse_ok(&[]).stream_copy_piece_bytes, 16 << 20);
    for (raw, mib) in [("1", 1), ("4", 4), (" 16 ", 16)] {
        let got = parse_ok(&[("HIPFILE_STREAM_COPY_PIECE_MB", raw)]).stream_copy_piece_bytes;
        assert_eq!(got, mib << 20, "{raw:?}");
    }
    for bad in ["0", "2", "8", "32", "-4", "four"] {
        let error = rejected(
            &[("HIPFILE_STREAM_COPY_PIECE_MB", bad)],
            &cpus(4),
            "HIPFILE_STREAM_COPY_PIECE_MB",
        );
        assert!(error.to_string().contains("1, 4 or 16"), "{bad:?}: {error}");
    }
    // Writes copied on their stream in pieces: off (0) unless set; 0 (whole) or a power of
    // two from 64 to 8192 KiB.
    assert_eq!(parse_ok(&[]).stream_write_piece_bytes, 0);
    let got = parse_ok(&[("HIPFILE_STREAM_WRITE_PIECE_KB", "1024")]).stream_write_piece_bytes;
    assert_eq!(got, 1 << 20);
    for (raw, kib) in [("0", 0), ("64", 64), (" 256 ", 256), ("8192", 8192)] {
        let got = parse_ok(&[("HIPFILE_STREAM_WRITE_PIECE_KB", raw)]).stream_write_piece_bytes;
        assert_eq!(got, kib << 10, "{raw:?}");
    }
    for bad in ["32", "100", "16384", "-64", "1M"] {
        let error = rejected(
            &[("HIPFILE_STREAM_WRITE_PIECE_KB", bad)],
            &cpus(4),
            "HIPFILE_STREAM_WRITE_PIECE_KB",
        );
        assert!(error.to_string().contains("power of two"), "{bad:?}: {error}");
    }
    // Writes copied on their own streams under `all`: on unless set off.
    assert!(parse_ok(&[]).stream_copy_writes);
    for (raw, want) in [("0", false), ("off", false), ("false", false), ("1", true), (" on ", true)]
    {
        let got = parse_ok(&[("HIPFILE_STREAM_COPY_WRITES", raw)]).stream_copy_writes;
        assert_eq!(got, want, "{raw:?}");
    }
    rejected(&[("HIPFILE_STREAM_COPY_WRITES", "reads")], &cpus(4), "HIPFILE_STREAM_COPY_WRITES");
    // The memory of large read slots: the backend's choice unless set.
    use hipfile_runtime::config::StreamCopySlots;
    assert_eq!(parse_ok(&[]).stream_copy_slots, StreamCopySlots::Auto);
    for (raw, want) in [("pinned", StreamCopySlots::Pinned), (" device ", StreamCopySlots::Device)]
    {
        let got = parse_ok(&[("HIPFILE_STREAM_COPY_SLOTS", raw)]).stream_copy_slots;
        assert_eq!(got, want, "{raw:?}");
    }
    for bad in ["gpu", "Device", "1"] {
        let error =
            rejected(&[("HIPFILE_STREAM_COPY_SLOTS", bad)], &cpus(4), "HIPFILE_STREAM_COPY_SLOTS");
        assert!(error.to_string().contains("pinned or device"), "{bad:?}: {error}");
    }
    // The device slots' cap per device: 1 GiB unless set, at least 16 MiB.
    assert_eq!(parse_ok(&[]).stream_copy_device_cap_bytes, 1 << 30);
    for (raw, mib) in [("16", 16), (" 256 ", 256), ("4096", 4096)] {
        let got = parse_ok(&[("HIPFILE_STREAM_COPY_DEVICE_MB", raw)]).stream_copy_device_cap_bytes;
        assert_eq!(got, mib << 20, "{raw:?}");
    }
    for bad in ["0", "8", "-1", "lots"] {
        rejected(
            &[("HIPFILE_STREAM_COPY_DEVICE_MB", bad)],
            &cpus(4),
            "HIPFILE_STREAM_COPY_DEVICE_MB",
        );
    }
    // What a read does past the device slots' cap: share its stream's slot unless set.
    use hipfile_runtime::config::DeviceSlotsFull;
    assert_eq!(parse_ok(&[]).stream_copy_device_full, DeviceSlotsFull::Share);
    for (raw, want) in [("pinned", DeviceSlotsFull::Pinned), (" share ", DeviceSlotsFull::Share)] {
        let got = parse_ok(&[("HIPFILE_STREAM_COPY_DEVICE_FULL", raw)]).stream_copy_device_full;
        assert_eq!(got, want, "{raw:?}");
    }
    for bad in ["shared", "Share", "1"] {
        let error = rejected(
            &[("HIPFILE_STREAM_COPY_DEVICE_FULL", bad)],
            &cpus(4),
            "HIPFILE_STREAM_COPY_DEVICE_FULL",
        );
        assert!(error.to_string().contains("pinned or share"), "{bad:?}: {error}");
    }
    // How long device slots may go unused before their memory goes back: 5 s unless set,
    // 0 (never) to a day.
    assert_eq!(parse_ok(&[]).stream_copy_device_idle_ms, 5_000);
    for (raw, ms) in [("0", 0), (" 250 ", 250), ("86400000", 86_400_000)] {
        let got =
            parse_ok(&[("HIPFILE_STREAM_COPY_DEVICE_IDLE_MS", raw)]).stream_copy_device_idle_ms;
        assert_eq!(got, ms, "{raw:?}");
    }
    for bad in ["86400001", "-1", "1.5", "soon"] {
        let error = rejected(
            &[("HIPFILE_STREAM_COPY_DEVICE_IDLE_MS", bad)],
            &cpus(4),
            "HIPFILE_STREAM_COPY_DEVICE_IDLE_MS",
        );
        assert!(error.to_string().contains("milliseconds"), "{bad:?}: {error}");
    }
}
