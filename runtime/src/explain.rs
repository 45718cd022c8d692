//! "Why this path": what path a file's and a buffer's I/O takes, and why
//! ([`Driver::explain_path`]; C: `hipfileExplainPath`; `hipfile-bench check`).
//!
//! Silent fallback is the most reported pain with cuFile (compat mode taken without a
//! word). hipfile-rs has one data path — file ⇄ pinned host staging ⇄ device — and
//! within it a few choices that cost speed: O_DIRECT or the page cache per file and per
//! request alignment, the caller's thread or the engine per request size, a device-side
//! or a blocking release per device. This module names each choice and its cause; the
//! driver also logs once when a file or a request leaves O_DIRECT
//! (`HIPFILE_LOG=info`).

use std::fmt;

use hipfile_core::OpError;

use crate::config::CallerThread;
use crate::device::MemoryType;
use crate::driver::{Driver, HandleId};
use crate::error::Error;

/// One decision and its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathItem {
    /// What it is about (`device`, `data path`, `sync requests`, `file`, `O_DIRECT`,
    /// `buffer`, `async release`).
    pub topic: &'static str,
    /// `false` when this choice costs speed against the best this library does.
    pub fast: bool,
    /// The choice and its cause, one line.
    pub text: String,
}

/// The answer of [`Driver::explain_path`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathExplanation {
    /// The decisions, general first.
    pub items: Vec<PathItem>,
}

impl PathExplanation {
    /// Whether every choice is the fast one.
    pub fn all_fast(&self) -> bool {
        self.items.iter().all(|item| item.fast)
    }

    fn push(&mut self, topic: &'static str, fast: bool, text: String) {
        self.items.push(PathItem { topic, fast, text });
    }
}

impl fmt::Display for PathExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for item in &self.items {
            let mark = if item.fast { "" } else { " [slower]" };
            writeln!(f, "{}{mark}: {}", item.topic, item.text)?;
        }
        Ok(())
    }
}

impl Driver {
    /// Explains the path of I/O on `handle` (a registered file) into `buffer_addr`
    /// (device memory, registered or not); either may be left out.
    ///
    /// # Errors
    /// `hipFileHandleNotRegistered` for an unknown handle. A buffer that I/O would
    /// refuse is not an error: the explanation says why (with the code I/O returns).
    pub fn explain_path(
        &self,
        handle: Option<HandleId>,
        buffer_addr: Option<u64>,
    ) -> Result<PathExplanation, Error> {
        let mut out = PathExplanation::default();
        let config = self.config();
        let device = self.device();
        out.push(
            "device",
            true,
            format!(
                "{} backend, {} device(s){}",
                device.kind().name(),
                device.device_count(),
                device.hardware_queue_setting().map_or(String::new(), |s| format!("; {s}"))
            ),
        );
        out.push(
            "data path",
            true,
            "file <-> pinned host staging <-> device memory (hipfile-rs has no GPUDirect \
             Storage / P2PDMA path: every byte is staged)"
                .into(),
        );
        if !self.compat_mode_allowed() {
            out.push(
                "sync I/O",
                false,
                "disabled (HIPFILE_ALLOW_COMPAT_MODE=false / PropertiesAllowCompatMode): \
                 hipFileRead/hipFileWrite and batch submissions return 5030"
                    .into(),
            );
        }
        let chunk_kib = config.staging_chunk_bytes >> 10;
        let on_caller = device.copies_on_caller_thread();
        out.push(
            "sync requests",
            true,
            format!(
                "{}larger ones split into whole {chunk_kib} KiB chunks over up to {} of {} \
                 executors{} (io_uring{}), disk and copies overlapped",
                match (on_caller, config.caller_thread) {
                    (false, _) => String::new(),
                    (true, CallerThread::Small) => format!(
                        "up to {chunk_kib} KiB run on the caller's thread (pread/pwrite + one copy); "
                    ),
                    (true, CallerThread::Busy) => format!(
                        "up to {chunk_kib} KiB, and larger ones while every executor is busy \
                         (HIPFILE_CALLER_THREAD=busy), run on the caller's thread \
                         (pread/pwrite + one copy per chunk); "
                    ),
                    (true, CallerThread::Always) => "every one runs on the caller's thread, \
                         chunk by chunk (HIPFILE_CALLER_THREAD=always); otherwise "
                        .to_string(),
                },
                config.request_parallelism,
                config.executor_cpus.len(),
                config.busy_fan_out.map_or(String::new(), |least| format!(
                    ", those with no job in flight but at least {least} (HIPFILE_BUSY_FAN_OUT)"
                )),
                if config.use_io_uring { "" } else { " off: blocking pread/pwrite executors" },
            ),
        );
        out.push(
            "queued requests",
            true,
            match config.loaded_fan_out {
                Some(parts) => format!(
                    "async ops and batch entries split as sync requests are while fewer than \
                     half as many as executors are in flight, then into at most {parts} parts \
                     on the least loaded executors (HIPFILE_LOADED_FAN_OUT)"
                ),
                None => "async ops and batch entries split as sync requests are \
                         (HIPFILE_LOADED_FAN_OUT=off)"
                    .to_string(),
            },
        );
        if let Some(handle) = handle {
            self.explain_file(&mut out, handle)?;
        }
        let ordinal = match buffer_addr {
            Some(addr) => self.explain_buffer(&mut out, addr),
            None => Some(0),
        };
        if let Some(ordinal) = ordinal {
            let (fast, text) = if device.supports_stream_memops(ordinal) {
                (
                    true,
                    format!(
                        "device {ordinal}: a registered stream waits on a word the engine writes once \
                     the op is done (stream memory operations)"
                    ),
                )
            } else {
                (
                    false,
                    format!(
                        "device {ordinal} has no stream memory operations: the stream's host \
                     function blocks until the op is done (its callback thread waits)"
                    ),
                )
            };
            out.push("async release", fast, text);
        }
        Ok(out)
    }

    fn explain_file(&self, out: &mut PathExplanation, handle: HandleId) -> Result<(), Error> {
        let file = self.file(handle)?;
        let access = match (file.can_read(), file.can_write()) {
            (true, true) => "read-write",
            (true, false) => "read-only (writes fail with EBADF)",
            _ => "write-only (reads fail with EBADF)",
        };
        out.push("file", true, format!("fd {}, {:?}, {access}", file.client_fd(), file.kind()));
        match (file.dio_alignment(), file.no_direct_reason()) {
            (Some(dio), _) => {
                let offset_align = dio.offset_bytes.max(self.page_size_bytes());
                out.push(
                    "O_DIRECT",
                    true,
                    format!(
                        "yes: chunks at file offsets that are multiples of {offset_align} bytes \
                         and lengths of {} bytes bypass the page cache; an unaligned head or \
                         tail of a request goes through it{}",
                        dio.offset_bytes,
                        if file.direct_policy() == crate::file::DirectPolicy::Auto {
                            ", and so does a read of a range the page cache holds entirely \
                             (HIPFILE_ODIRECT=auto; `on` bypasses the cache for those too)"
                        } else {
                            ""
                        }
                    ),
                );
            }
            (None, Some(reason)) => {
                out.push(
                    "O_DIRECT",
                    false,
                    format!("no ({reason}): every byte goes through the page cache"),
                );
            }
            (None, None) => {
                out.push("O_DIRECT", false, "no: every byte goes through the page cache".into())
            }
        }
        out.push("small async reads", true, self.explain_inline_reads(&file));
        Ok(())
    }

    /// Whether small async reads of `file` on an idle stream are read inside
    /// the submit call (`async_op::inline_read`): the setting, the device, and a one-byte
    /// `RWF_NOWAIT` read of the file's first byte.
    fn explain_inline_reads(&self, file: &crate::file::FileHandle) -> String {
        let inline = self.inline_reads();
        let kib = inline.cap_bytes >> 10;
        if inline.cap_bytes == 0 {
            return "read by the engine when their stream reaches them \
                    (HIPFILE_INLINE_READ_KB=0)"
                .into();
        }
        if inline.pool.is_none() {
            return "read by the engine when their stream reaches them (this device copies \
                    on no user stream)"
                .into();
        }
        let mut byte = [0u8; 1];
        let cached = file.can_read()
            && crate::file::pread_cached(file.buffered_fd(), &mut byte, 0).is_some();
        format!(
            "reads of at most {kib} KiB on an idle stream are read inside the \
             submit call when the page cache holds every byte (HIPFILE_INLINE_READ_KB){}",
            if cached {
                ""
            } else {
                "; this file's first byte is not cached now, or its file system cannot read \
                 without waiting: such reads take the engine"
            }
        )
    }

    /// Explains the buffer; returns its device when I/O would accept it.
    fn explain_buffer(&self, out: &mut PathExplanation, addr: u64) -> Option<u32> {
        match self.resolve_buffer(addr) {
            Ok(buffer) => {
                let text = if buffer.is_registered() {
                    format!(
                        "registered, {} bytes from {addr:#x}, device {}",
                        buffer.span.len_bytes, buffer.device_ordinal
                    )
                } else {
                    format!(
                        "device memory of device {}, not registered (I/O may use the {} bytes \
                         from {addr:#x} to the end of its allocation; registering it changes no speed here)",
                        buffer.device_ordinal, buffer.span.len_bytes
                    )
                };
                out.push("buffer", true, text);
                Some(buffer.device_ordinal)
            }
            Err(error) => {
                let what = match error.code {
                    OpError::HipMemoryTypeInvalid => self.memory_kind(addr),
                    OpError::InvalidValue => "a NULL or unknown address".into(),
                    _ => "not usable".into(),
                };
                out.push(
                    "buffer",
                    false,
                    format!(
                        "{what}: I/O refuses it with {} ({}); hipFile I/O needs device memory",
                        error.code.code(),
                        error.code.message()
                    ),
                );
                None
            }
        }
    }

    fn memory_kind(&self, addr: u64) -> String {
        match self.device().pointer_info(addr).map(|info| info.memory_type) {
            Ok(MemoryType::Host) => "host memory".into(),
            Ok(MemoryType::Managed) => "managed (unified) memory".into(),
            Ok(MemoryType::Array) => "array memory".into(),
            Ok(MemoryType::Device) => "device memory".into(),
            Err(_) => "memory the device cannot classify".into(),
        }
    }
}
