"""hipfile: GPU file I/O (AMD hipFile / NVIDIA cuFile API) on hipfile-rs.

Low level, one call per C function (names of ``cuda.bindings.cufile`` / AMD's hipfile
bindings): :func:`driver_open`, :func:`driver_close`, :func:`use_count`,
:func:`handle_register`, :func:`handle_deregister`, :func:`buf_register`,
:func:`buf_deregister`, :func:`read`, :func:`write`, :func:`stream_register`,
:func:`stream_deregister`, :func:`read_async`, :func:`write_async`, the ``batch_io_*``
calls, ``get/set_parameter_size_t/bool/string`` (keys: :class:`SizeTConfigParameter`,
:class:`BoolConfigParameter`, :class:`StringConfigParameter`), :func:`driver_get_properties`
and the ``driver_set_*`` calls; errors raise :class:`HipFileError` (``.code``, e.g. 5022) or ``OSError``.

High level: :class:`File`, :func:`empty` (cpu-device memory), :class:`Stream`,
:mod:`hipfile.safetensors`.

Importing never touches a device: the device is chosen on the first call
(``HIPFILE_DEVICE``: ``auto`` tries ROCm, then CUDA, then the in-process cpu device).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, List, NamedTuple, Optional, Sequence

from . import _native
from ._buffers import resolve, stream_handle
from ._file import File
from ._memory import DeviceBuffer, device_buffer, empty
from ._native import (
    Batch,
    HipFileError,
    Stream,
    StreamFuture,
    buf_deregister,
    buf_register,
    device_count,
    device_kind,
    driver_close,
    driver_get_properties,
    driver_open,
    driver_set_max_cache_size,
    driver_set_max_direct_io_size,
    driver_set_max_pinned_mem_size,
    driver_set_poll_mode,
    explain_path,
    get_op_error_string,
    get_parameter_bool,
    get_parameter_size_t,
    get_parameter_string,
    handle_deregister,
    handle_register,
    read,
    read_async,
    set_parameter_bool,
    set_parameter_size_t,
    set_parameter_string,
    stream_deregister,
    stream_register,
    stream_synchronize,
    use_count,
    write,
    write_async,
)

__version__ = _native.VERSION

# hipFileStreamRegister flags (HIPFILE_STREAM_*).
STREAM_FIXED_BUF_OFFSET = 1
STREAM_FIXED_FILE_OFFSET = 2
STREAM_FIXED_FILE_SIZE = 4
STREAM_PAGE_ALIGNED_INPUTS = 8
STREAM_FIXED_ALL = 7


class SizeTConfigParameter(IntEnum):
    """``hipFileSizeTConfigParameter_t`` (what each maps to: README, "Parameters")."""

    PROFILE_STATS = 0
    EXECUTION_MAX_IO_QUEUE_DEPTH = 1
    EXECUTION_MAX_IO_THREADS = 2
    EXECUTION_MIN_IO_THRESHOLD_SIZE_KB = 3
    EXECUTION_MAX_REQUEST_PARALLELISM = 4
    PROPERTIES_MAX_DIRECT_IO_SIZE_KB = 5
    PROPERTIES_MAX_DEVICE_CACHE_SIZE_KB = 6
    PROPERTIES_PER_BUFFER_CACHE_SIZE_KB = 7
    PROPERTIES_MAX_DEVICE_PINNED_MEM_SIZE_KB = 8
    PROPERTIES_IO_BATCHSIZE = 9
    POLLTHRESHOLD_SIZE_KB = 10
    PROPERTIES_BATCH_IO_TIMEOUT_MS = 11


class BoolConfigParameter(IntEnum):
    """``hipFileBoolConfigParameter_t``."""

    PROPERTIES_USE_POLL_MODE = 0
    PROPERTIES_ALLOW_COMPAT_MODE = 1
    FORCE_COMPAT_MODE = 2
    FS_MISC_API_CHECK_AGGRESSIVE = 3
    EXECUTION_PARALLEL_IO = 4
    PROFILE_NVTX = 5
    PROPERTIES_ALLOW_SYSTEM_MEMORY = 6
    USE_PCIP2PDMA = 7
    PREFER_IO_URING = 8
    FORCE_ODIRECT_MODE = 9
    SKIP_TOPOLOGY_DETECTION = 10
    STREAM_MEMOPS_BYPASS = 11


class StringConfigParameter(IntEnum):
    """``hipFileStringConfigParameter_t``."""

    LOGGING_LEVEL = 0
    ENV_LOGFILE_PATH = 1
    LOG_DIR = 2


class OpCode(IntEnum):
    """``hipFileOpcode_t``."""

    READ = 0
    WRITE = 1


class Status(IntEnum):
    """``hipFileStatus_t`` of a batch entry."""

    WAITING = 1
    PENDING = 2
    INVALID = 4
    CANCELED = 8
    COMPLETE = 16
    TIMEOUT = 32
    FAILED = 64


class IOParams(NamedTuple):
    """One batch entry (``hipFileIOParams_t``)."""

    opcode: int
    fh: int
    dev_ptr: int
    file_offset: int
    size: int
    buf_offset: int = 0
    cookie: Any = None


class IOEvent(NamedTuple):
    """One finished batch entry (``hipFileIOEvents_t``): ``ret`` is the byte count
    (``COMPLETE``) or ``-errno`` / ``-code`` (``FAILED``)."""

    cookie: Any
    status: Status
    ret: int


def batch_io_set_up(nr: int) -> Batch:
    """``hipFileBatchIOSetUp``: a batch for up to ``nr`` (1..=128) entries."""
    return Batch(nr)


def batch_io_submit(batch: Batch, params: Sequence[IOParams]) -> None:
    """``hipFileBatchIOSubmit``: all entries are accepted or none (HipFileError)."""
    batch.submit([tuple(IOParams(*p)) for p in params])


def batch_io_get_status(batch: Batch, min_nr: int, max_nr: Optional[int] = None,
                        timeout: Optional[float] = None) -> List[IOEvent]:
    """``hipFileBatchIOGetStatus``: waits for ``min_nr`` finished entries or ``timeout``
    seconds, returns up to ``max_nr`` :class:`IOEvent`, each entry once."""
    return [IOEvent(c, Status(s), r) for c, s, r in batch.status(min_nr, max_nr, timeout)]


def batch_io_cancel(batch: Batch) -> None:
    """``hipFileBatchIOCancel``."""
    batch.cancel()


def batch_io_destroy(batch: Batch) -> None:
    """``hipFileBatchIODestroy``."""
    batch.destroy()


__all__ = [
    "BoolConfigParameter", "SizeTConfigParameter", "StringConfigParameter",
    "driver_get_properties", "driver_set_max_cache_size", "driver_set_max_direct_io_size",
    "driver_set_max_pinned_mem_size", "driver_set_poll_mode", "get_parameter_bool",
    "get_parameter_size_t", "get_parameter_string", "set_parameter_bool",
    "set_parameter_size_t", "set_parameter_string",
    "Batch", "DeviceBuffer", "File", "HipFileError", "IOEvent", "IOParams", "OpCode", "Status",
    "Stream", "StreamFuture", "batch_io_cancel", "batch_io_destroy", "batch_io_get_status",
    "batch_io_set_up", "batch_io_submit", "buf_deregister", "buf_register", "device_buffer",
    "device_count", "device_kind", "driver_close", "driver_open", "empty", "explain_path",
    "get_op_error_string",
    "handle_deregister", "handle_register", "read", "read_async", "resolve", "stream_deregister",
    "stream_handle", "stream_register", "stream_synchronize", "use_count", "write", "write_async",
    "STREAM_FIXED_ALL", "STREAM_FIXED_BUF_OFFSET", "STREAM_FIXED_FILE_OFFSET",
    "STREAM_FIXED_FILE_SIZE", "STREAM_PAGE_ALIGNED_INPUTS",
]
