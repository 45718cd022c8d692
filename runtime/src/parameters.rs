//! hipFile's configuration parameters (`hipFileGet/SetParameterSizeT/Bool/String`) and
//! driver properties (`hipFileDriverGetProperties`, `hipFileDriverSet*`) mapped onto
//! this engine's [`Config`].
//!
//! Every key hipFile defines is answered. A key with a setting here reads and writes it
//! (in hipFile's unit); a key this engine has no setting for reads the value that
//! describes what the engine does, and a write of any other value is refused with
//! `hipFileInvalidValue`, never ignored. Writes go through [`crate::Driver::configure`]:
//! they apply until the engine starts or a file is registered, then they are refused
//! with `hipFileDriverAlreadyOpen`. The README's "Parameters" table lists them all.

use hipfile_core::OpError;

use crate::config::Config;
use crate::error::Error;
use crate::file::DirectPolicy;

const KIB: usize = 1 << 10;

/// `HIPFILE_VERSION_{MAJOR,MINOR,PATCH}`: the hipFile API version this library
/// implements (`hipFileGetVersion`, the driver properties).
pub const API_VERSION: (u32, u32, u32) = (0, 2, 0);

/// Entries one batch may hold (hipFile's batch capacity, 1..=128).
pub(crate) const MAX_BATCH_ENTRIES: u32 = hipfile_core::MAX_BATCH_ENTRIES as u32;

/// `hipFileSizeTConfigParameter_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeParameter {
    /// Statistics level (counters are always on here: 1).
    ProfileStats = 0,
    /// Chunks in flight per op (`HIPFILE_QUEUE_DEPTH`).
    ExecutionMaxIoQueueDepth = 1,
    /// I/O executors (`HIPFILE_THREADS`).
    ExecutionMaxIoThreads = 2,
    /// KiB below which a request is not split (one staging chunk; read-only, follows
    /// `PropertiesMaxDirectIoSizeKb`).
    ExecutionMinIoThresholdSizeKb = 3,
    /// Executors one request may fan out to (`HIPFILE_REQUEST_PARALLELISM`).
    ExecutionMaxRequestParallelism = 4,
    /// KiB of the staging chunk, the unit of every read, write and copy
    /// (`HIPFILE_CHUNK_KB`).
    PropertiesMaxDirectIoSizeKb = 5,
    /// KiB of all executors' staging arenas together (`HIPFILE_STAGING_MB` × executors).
    PropertiesMaxDeviceCacheSizeKb = 6,
    /// KiB of one executor's staging arena (`HIPFILE_STAGING_MB`).
    PropertiesPerBufferCacheSizeKb = 7,
    /// KiB of pinned memory the engine may hold: arenas plus the fallback cap
    /// (`HIPFILE_PINNED_FALLBACK_MB`).
    PropertiesMaxDevicePinnedMemSizeKb = 8,
    /// Entries of one batch (read-only: 128).
    PropertiesIoBatchsize = 9,
    /// KiB up to which a sync request completes on the caller's thread (one staging
    /// chunk; read-only, follows `PropertiesMaxDirectIoSizeKb`).
    PollThresholdSizeKb = 10,
    /// Batch timeout in ms (read-only: 0, no timeout of its own).
    PropertiesBatchIoTimeoutMs = 11,
}

/// `hipFileBoolConfigParameter_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoolParameter {
    /// Sync requests of one chunk complete on the caller's thread (read-only: true).
    PropertiesUsePollMode = 0,
    /// The POSIX compatibility path is allowed (`HIPFILE_ALLOW_COMPAT_MODE`).
    PropertiesAllowCompatMode = 1,
    /// All I/O takes the compatibility path (read-only: true, there is no other).
    ForceCompatMode = 2,
    /// Aggressive file-system checks (read-only: false).
    FsMiscApiCheckAggressive = 3,
    /// Large requests fan out over several executors (`HIPFILE_REQUEST_PARALLELISM` > 1).
    ExecutionParallelIo = 4,
    /// NVTX ranges (read-only: false).
    ProfileNvtx = 5,
    /// Buffers in host memory (read-only: false; buffers are device memory).
    PropertiesAllowSystemMemory = 6,
    /// PCI P2PDMA (read-only: false).
    UsePcip2pdma = 7,
    /// The engine uses io_uring (`HIPFILE_IO_URING`; false: blocking executors).
    PreferIoUring = 8,
    /// O_DIRECT for every aligned chunk (`HIPFILE_ODIRECT=on`; false: `auto`).
    ForceOdirectMode = 9,
    /// Device/NIC topology detection skipped (read-only: true, none is done).
    SkipTopologyDetection = 10,
    /// Stream memory operations bypassed (read-only: false, they are used where the
    /// device supports them).
    StreamMemopsBypass = 11,
}

/// `hipFileStringConfigParameter_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StringParameter {
    /// Level of the library's messages (`crate::logging`: `OFF`, `ERROR`, `WARN`,
    /// `INFO`, `DEBUG`, `TRACE`; settable at any time).
    LoggingLevel = 0,
    /// Log file (read-only: empty; messages go to the application's logger, or stderr).
    EnvLogfilePath = 1,
    /// Log directory (read-only: empty).
    LogDir = 2,
}

impl SizeParameter {
    /// The key of hipFile's enum value `value`.
    ///
    /// # Errors
    /// `hipFileInvalidValue` for a value hipFile does not define.
    pub fn from_raw(value: i32) -> Result<SizeParameter, Error> {
        use SizeParameter::*;
        const ALL: [SizeParameter; 12] = [
            ProfileStats,
            ExecutionMaxIoQueueDepth,
            ExecutionMaxIoThreads,
            ExecutionMinIoThresholdSizeKb,
            ExecutionMaxRequestParallelism,
            PropertiesMaxDirectIoSizeKb,
            PropertiesMaxDeviceCacheSizeKb,
            PropertiesPerBufferCacheSizeKb,
            PropertiesMaxDevicePinnedMemSizeKb,
            PropertiesIoBatchsize,
            PollThresholdSizeKb,
            PropertiesBatchIoTimeoutMs,
        ];
        key(&ALL, value)
    }

    /// The value in force, in hipFile's unit.
    pub fn get(self, config: &Config) -> u64 {
        use SizeParameter::*;
        let kib = |bytes: usize| (bytes / KIB) as u64;
        match self {
            ProfileStats => 1,
            ExecutionMaxIoQueueDepth => config.chunks_in_flight as u64,
            ExecutionMaxIoThreads => config.executor_count() as u64,
            ExecutionMinIoThresholdSizeKb | PropertiesMaxDirectIoSizeKb | PollThresholdSizeKb => {
                kib(config.staging_chunk_bytes)
            }
            ExecutionMaxRequestParallelism => config.request_parallelism as u64,
            PropertiesMaxDeviceCacheSizeKb => {
                kib(config.staging_per_executor_bytes.saturating_mul(config.executor_count()))
            }
            PropertiesPerBufferCacheSizeKb => kib(config.staging_per_executor_bytes),
            PropertiesMaxDevicePinnedMemSizeKb => kib(config.pinned_cap_bytes()),
            PropertiesIoBatchsize => u64::from(MAX_BATCH_ENTRIES),
            PropertiesBatchIoTimeoutMs => 0,
        }
    }

    /// Applies `value` to `config` (validated by the caller).
    ///
    /// # Errors
    /// `hipFileInvalidValue` for a value out of range or a read-only key given another
    /// value than its own.
    pub fn set(self, config: &mut Config, value: u64) -> Result<(), Error> {
        use SizeParameter::*;
        let count = || usize::try_from(value).map_err(|_| invalid());
        let bytes =
            || usize::try_from(value).ok().and_then(|kib| kib.checked_mul(KIB)).ok_or_else(invalid);
        match self {
            ExecutionMaxIoQueueDepth => config.chunks_in_flight = count()?,
            ExecutionMaxIoThreads => {
                let executors = count()?;
                if executors == 0 {
                    return Err(invalid());
                }
                let pool = crate::config::usable_cpus();
                config.executor_cpus = pool.iter().copied().cycle().take(executors).collect();
                config.request_parallelism = config.request_parallelism.clamp(1, executors);
            }
            ExecutionMaxRequestParallelism => config.request_parallelism = count()?,
            PropertiesMaxDirectIoSizeKb => config.staging_chunk_bytes = bytes()?,
            PropertiesMaxDeviceCacheSizeKb => {
                config.staging_per_executor_bytes = bytes()? / config.executor_count().max(1);
            }
            PropertiesPerBufferCacheSizeKb => config.staging_per_executor_bytes = bytes()?,
            PropertiesMaxDevicePinnedMemSizeKb => {
                let arenas =
                    config.executor_count().saturating_mul(config.staging_per_executor_bytes);
                // The executors' chunks the pool holds on top of its cap under
                // HIPFILE_CALLER_THREAD=busy/always, so that the value reads back as set.
                let executors_chunks =
                    config.fallback_pool_bytes().saturating_sub(config.pinned_fallback_cap_bytes);
                config.pinned_fallback_cap_bytes = bytes()?
                    .checked_sub(arenas)
                    .and_then(|rest| rest.checked_sub(executors_chunks))
                    .ok_or_else(invalid)?;
            }
            ProfileStats
            | ExecutionMinIoThresholdSizeKb
            | PropertiesIoBatchsize
            | PollThresholdSizeKb
            | PropertiesBatchIoTimeoutMs => return read_only(self.get(config) == value),
        }
        Ok(())
    }
}

impl BoolParameter {
    /// The key of hipFile's enum value `value`.
    ///
    /// # Errors
    /// `hipFileInvalidValue` for a value hipFile does not define.
    pub fn from_raw(value: i32) -> Result<BoolParameter, Error> {
        use BoolParameter::*;
        const ALL: [BoolParameter; 12] = [
            PropertiesUsePollMode,
            PropertiesAllowCompatMode,
            ForceCompatMode,
            FsMiscApiCheckAggressive,
            ExecutionParallelIo,
            ProfileNvtx,
            PropertiesAllowSystemMemory,
            UsePcip2pdma,
            PreferIoUring,
            ForceOdirectMode,
            SkipTopologyDetection,
            StreamMemopsBypass,
        ];
        key(&ALL, value)
    }

    /// The value in force.
    pub fn get(self, config: &Config) -> bool {
        use BoolParameter::*;
        match self {
            PropertiesUsePollMode | ForceCompatMode | SkipTopologyDetection => true,
            PropertiesAllowCompatMode => config.allow_compat_mode,
            ExecutionParallelIo => config.request_parallelism > 1,
            PreferIoUring => config.use_io_uring,
            ForceOdirectMode => config.direct == DirectPolicy::On,
            FsMiscApiCheckAggressive
            | ProfileNvtx
            | PropertiesAllowSystemMemory
            | UsePcip2pdma
            | StreamMemopsBypass => false,
        }
    }

    /// Applies `value` to `config` (validated by the caller).
    ///
    /// # Errors
    /// `hipFileInvalidValue` for a read-only key given another value than its own.
    pub fn set(self, config: &mut Config, value: bool) -> Result<(), Error> {
        use BoolParameter::*;
        match self {
            PropertiesAllowCompatMode => config.allow_compat_mode = value,
            ExecutionParallelIo => {
                config.request_parallelism = if value { config.executor_count() } else { 1 };
            }
            PreferIoUring => config.use_io_uring = value,
            ForceOdirectMode => {
                config.direct = if value { DirectPolicy::On } else { DirectPolicy::Auto };
            }
            _ => return read_only(self.get(config) == value),
        }
        Ok(())
    }
}

impl StringParameter {
    /// The key of hipFile's enum value `value`.
    ///
    /// # Errors
    /// `hipFileInvalidValue` for a value hipFile does not define.
    pub fn from_raw(value: i32) -> Result<StringParameter, Error> {
        use StringParameter::*;
        key(&[LoggingLevel, EnvLogfilePath, LogDir], value)
    }

    /// The value in force.
    pub fn get(self) -> &'static str {
        match self {
            StringParameter::LoggingLevel => crate::logging::level_name(),
            StringParameter::EnvLogfilePath | StringParameter::LogDir => "",
        }
    }

    /// Sets the messages' level (any case; `WARNING` too); the file and directory keys
    /// accept only their own value (empty).
    ///
    /// # Errors
    /// `hipFileInvalidValue` for a name that is not a level, or another file or
    /// directory than none.
    pub fn set(self, value: &str) -> Result<(), Error> {
        match self {
            StringParameter::LoggingLevel => crate::logging::set_level(value),
            StringParameter::EnvLogfilePath | StringParameter::LogDir => {
                read_only(self.get() == value)
            }
        }
    }
}

/// `hipFileDriverGetProperties`' values, from the configuration in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverProperties {
    /// KiB up to which sync requests complete on the caller's thread.
    pub poll_threshold_kib: u64,
    /// KiB of the staging chunk.
    pub max_direct_io_kib: u64,
    /// `hipFileDriverControlFlags_t` bits: UsePollMode (bit 0), AllowCompatMode (bit 1).
    pub control_flags: u32,
    /// `hipFileFeatureFlags_t` bits: StreamsSupported (bit 2), ParallelIOSupported (bit 3)
    /// when requests fan out.
    pub feature_flags: u32,
    /// KiB of all staging arenas.
    pub max_device_cache_kib: u64,
    /// KiB of one executor's arena.
    pub per_buffer_cache_kib: u64,
    /// KiB of pinned memory the engine may hold.
    pub max_pinned_kib: u64,
    /// Entries of one batch.
    pub max_batch_entries: u32,
    /// Batch timeout in ms.
    pub max_batch_timeout_ms: u32,
}

impl DriverProperties {
    /// The properties of `config`.
    pub fn of(config: &Config) -> DriverProperties {
        use SizeParameter::*;
        let control_flags = u32::from(BoolParameter::PropertiesUsePollMode.get(config))
            | u32::from(config.allow_compat_mode) << 1;
        // Batch I/O (bit 1), streams (bit 2), parallel I/O (bit 3) when requests fan out.
        let feature_flags = 1 << 1 | 1 << 2 | u32::from(config.request_parallelism > 1) << 3;
        DriverProperties {
            poll_threshold_kib: PollThresholdSizeKb.get(config),
            max_direct_io_kib: PropertiesMaxDirectIoSizeKb.get(config),
            control_flags,
            feature_flags,
            max_device_cache_kib: PropertiesMaxDeviceCacheSizeKb.get(config),
            per_buffer_cache_kib: PropertiesPerBufferCacheSizeKb.get(config),
            max_pinned_kib: PropertiesMaxDevicePinnedMemSizeKb.get(config),
            max_batch_entries: MAX_BATCH_ENTRIES,
            max_batch_timeout_ms: PropertiesBatchIoTimeoutMs.get(config) as u32,
        }
    }
}

fn invalid() -> Error {
    Error::new(OpError::InvalidValue)
}

fn read_only(same: bool) -> Result<(), Error> {
    if same { Ok(()) } else { Err(invalid()) }
}

fn key<K: Copy>(all: &[K], value: i32) -> Result<K, Error> {
    usize::try_from(value).ok().and_then(|index| all.get(index).copied()).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::defaults_for(&[0, 1, 2, 3])
    }

    #[test]
    fn every_key_reads_and_unknown_keys_are_refused() {
        let config = config();
        for raw in 0..12 {
            let size = SizeParameter::from_raw(raw).expect("size key");
            assert_eq!(size as i32, raw);
            let _ = size.get(&config);
            let flag = BoolParameter::from_raw(raw).expect("bool key");
            assert_eq!(flag as i32, raw);
            let _ = flag.get(&config);
        }
        for raw in 0..3 {
            assert_eq!(StringParameter::from_raw(raw).expect("string key") as i32, raw);
        }
        for raw in [-1, 12, i32::MAX, i32::MIN] {
            assert!(SizeParameter::from_raw(raw).is_err());
            assert!(BoolParameter::from_raw(raw).is_err());
        }
        assert!(StringParameter::from_raw(3).is_err());
    }

    #[test]
    fn settings_round_trip_in_hipfile_units() {
        let mut config = config();
        use SizeParameter::*;
        for (key, value) in [
            (ExecutionMaxIoQueueDepth, 8),
            (ExecutionMaxIoThreads, 3),
            (ExecutionMaxRequestParallelism, 2),
            (PropertiesMaxDirectIoSizeKb, 512),
            (PropertiesPerBufferCacheSizeKb, 8192),
        ] {
            key.set(&mut config, value).expect("settable");
            config.validate().expect("valid");
            assert_eq!(key.get(&config), value, "{key:?}");
        }
        // Derived keys follow their settings.
        assert_eq!(ExecutionMinIoThresholdSizeKb.get(&config), 512);
        assert_eq!(PollThresholdSizeKb.get(&config), 512);
        assert_eq!(PropertiesMaxDeviceCacheSizeKb.get(&config), 3 * 8192);
        PropertiesMaxDeviceCacheSizeKb.set(&mut config, 3 * 4096).expect("settable");
        assert_eq!(PropertiesPerBufferCacheSizeKb.get(&config), 4096);
        PropertiesMaxDevicePinnedMemSizeKb.set(&mut config, 3 * 4096 + 2048).expect("ok");
        assert_eq!(config.pinned_fallback_cap_bytes, 2048 * KIB);
        assert_eq!(PropertiesMaxDevicePinnedMemSizeKb.get(&config), 3 * 4096 + 2048);
        // Under HIPFILE_CALLER_THREAD=busy the pool holds a chunk (512 KiB) per executor
        // more: the cap set leaves room for them, and the value reads back as set.
        let mut busy =
            Config { caller_thread: crate::config::CallerThread::Busy, ..config.clone() };
        PropertiesMaxDevicePinnedMemSizeKb.set(&mut busy, 3 * 4096 + 4096).expect("ok");
        assert_eq!(busy.pinned_fallback_cap_bytes, (4096 - 3 * 512) * KIB);
        assert_eq!(PropertiesMaxDevicePinnedMemSizeKb.get(&busy), 3 * 4096 + 4096);
        // Less pinned memory than the arenas themselves: refused.
        assert!(PropertiesMaxDevicePinnedMemSizeKb.set(&mut config, 1024).is_err());
        // Read-only keys: their own value passes, any other is refused.
        ProfileStats.set(&mut config, 1).expect("own value");
        assert!(ProfileStats.set(&mut config, 2).is_err());
        assert!(PollThresholdSizeKb.set(&mut config, 4).is_err());
        assert!(PropertiesIoBatchsize.set(&mut config, 64).is_err());
        assert!(ExecutionMaxIoThreads.set(&mut config, 0).is_err());
        assert!(PropertiesMaxDirectIoSizeKb.set(&mut config, u64::MAX).is_err());
    }

    #[test]
    fn flags_map_onto_the_engine() {
        let mut config = config();
        use BoolParameter::*;
        ForceOdirectMode.set(&mut config, true).expect("settable");
        assert_eq!(config.direct, DirectPolicy::On);
        ForceOdirectMode.set(&mut config, false).expect("settable");
        assert_eq!(config.direct, DirectPolicy::Auto);
        ExecutionParallelIo.set(&mut config, false).expect("settable");
        assert_eq!(config.request_parallelism, 1);
        assert!(!ExecutionParallelIo.get(&config));
        ExecutionParallelIo.set(&mut config, true).expect("settable");
        assert_eq!(config.request_parallelism, config.executor_count());
        PreferIoUring.set(&mut config, false).expect("settable");
        assert!(!config.use_io_uring);
        PropertiesAllowCompatMode.set(&mut config, false).expect("settable");
        assert!(!config.allow_compat_mode);
        ForceCompatMode.set(&mut config, true).expect("its own value");
        assert!(ForceCompatMode.set(&mut config, false).is_err(), "there is no other path");
        assert!(UsePcip2pdma.set(&mut config, true).is_err());
        let properties = DriverProperties::of(&config);
        assert_eq!(properties.control_flags, 0b01, "poll mode on, compat mode off");
        assert_eq!(properties.feature_flags, 0b1110, "batch, streams, parallel I/O");
        assert!(StringParameter::LogDir.set("/tmp").is_err());
        StringParameter::LogDir.set("").expect("its own value");
    }

    #[test]
    fn the_level_parameter_sets_and_shows_the_filter() {
        use crate::logging::{level_name, set_level};
        let before = log::max_level();
        set_level("debug").expect("a level");
        assert_eq!(level_name(), "DEBUG");
        assert_eq!(StringParameter::LoggingLevel.get(), "DEBUG");
        assert!(set_level("loud").is_err());
        assert_eq!(level_name(), "DEBUG", "a bad name changes nothing");
        log::set_max_level(before);
    }
}
