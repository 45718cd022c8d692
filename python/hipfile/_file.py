"""``hipfile.File``: a registered file as a context manager."""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import threading
from typing import Any, Optional

from . import _native
from ._buffers import Span, resolve, stream_handle, wait_for_producer
from ._memory import empty

_MODES = {
    "r": os.O_RDONLY,
    "r+": os.O_RDWR,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "x+": os.O_RDWR | os.O_CREAT | os.O_EXCL,
}

_session_lock = threading.Lock()
_session_held = False


def _hold_session() -> None:
    """Takes, at the first :class:`File`, one use of the driver that the process keeps
    until the interpreter exits. Every File also holds a use of its own, so this one
    only keeps the driver open *between* Files: closing it at the last File's close
    would stop the engine, and the next File would start it again (executors, pinned
    staging, the GPU context: about a second on a GPU machine, paid by every
    ``safetensors.load_file`` of a loop otherwise)."""
    global _session_held
    with _session_lock:
        if _session_held:
            return
        _native.driver_open()
        _session_held = True
        atexit.register(_release_session)


def _release_session() -> None:
    global _session_held
    with _session_lock:
        if _session_held and _native.use_count() > 0:
            _native.driver_close()
        _session_held = False


_pool_lock = threading.Lock()
_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """The thread pool running ``pread`` / ``pwrite`` (the GIL is released during I/O)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = min(32, 4 * (os.cpu_count() or 1))
            _pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="hipfile-py-io")
        return _pool


class File:
    """A file opened and registered with the driver (``hipFileHandleRegister``).

    ``mode``: ``"r"``, ``"r+"``, ``"w"``, ``"w+"``, ``"x"``, ``"x+"`` (binary; append
    modes are refused, all I/O is positional). ``direct``: ``"auto"`` follows the process-wide
    policy (``HIPFILE_ODIRECT``: O_DIRECT where the file supports it unless turned off);
    ``True`` asks for O_DIRECT on this file (page cache where it cannot have it, with a
    warning); ``False`` keeps this file in the page cache. :meth:`explain` says which
    path the file's I/O takes and why.

    Buffers are device memory (``hipfile.empty``, GPU tensors) or, on the cpu device,
    host buffers such as numpy arrays, staged through a cpu-device buffer (one copy).
    """

    def __init__(self, path: "os.PathLike[str] | str", mode: str = "r", direct: Any = "auto"):
        if mode.replace("b", "") not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, not {mode!r}")
        if direct not in ("auto", True, False):
            raise ValueError(f"direct must be 'auto', True or False, not {direct!r}")
        self.name = os.fspath(path)
        self.mode = mode
        self._fd = os.open(self.name, _MODES[mode.replace("b", "")] | os.O_CLOEXEC, 0o644)
        self._handle = 0
        self._pending: "set[concurrent.futures.Future]" = set()
        self._lock = threading.Lock()
        try:
            _hold_session()
            _native.driver_open()
            try:
                self._handle = _native.handle_register(
                    self._fd, None if direct == "auto" else bool(direct)
                )
            except BaseException:
                _native.driver_close()
                raise
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    # -- life cycle ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def handle(self) -> int:
        """The registered handle (``hipFileHandle_t``), for the low-level calls."""
        self._check_open()
        return self._handle

    def fileno(self) -> int:
        self._check_open()
        return self._fd

    def explain(self, buf: Any = None) -> str:
        """Why this path: one line per decision of the path this file's I/O (into
        ``buf``, when given) takes, each with its cause (``hipfileExplainPath``)."""
        dev_ptr = None if buf is None else resolve(buf).ptr
        return _native.explain_path(self.handle, dev_ptr)

    def counters(self) -> dict:
        """Bytes moved so far through O_DIRECT and through the page cache."""
        direct_read, buffered_read, direct_written, buffered_written = _native.handle_counters(
            self.handle
        )
        return {"direct_read": direct_read, "buffered_read": buffered_read,
                "direct_written": direct_written, "buffered_written": buffered_written}

    def close(self) -> None:
        """Waits for this file's ``pread``/``pwrite`` futures, deregisters, closes."""
        if self.closed:
            return
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending)
        _native.handle_deregister(self._handle)
        os.close(self._fd)
        self._fd = -1
        _native.driver_close()

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"handle=0x{self._handle:x}"
        return f"<hipfile.File {self.name!r} mode={self.mode!r} {state}>"

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on a closed hipfile.File")

    # -- synchronous ----------------------------------------------------------------

    def read(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
             buf_offset: int = 0) -> int:
        """Reads up to ``size`` bytes (default: the rest of ``buf``) at ``file_offset``
        into ``buf`` at ``buf_offset``; returns the byte count (short only at EOF)."""
        self._check_open()
        span = resolve(buf)
        size = _size(span, size, buf_offset)
        if span.host is None:
            wait_for_producer(span)
            return _native.read(self._handle, span.ptr, size, file_offset, buf_offset)
        return self._read_staged(span, size, file_offset, buf_offset)

    def write(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
              buf_offset: int = 0) -> int:
        """Writes ``size`` bytes (default: the rest of ``buf``) of ``buf`` from
        ``buf_offset`` at ``file_offset``; returns the byte count."""
        self._check_open()
        span = resolve(buf)
        size = _size(span, size, buf_offset)
        if span.host is None:
            wait_for_producer(span)
            return _native.write(self._handle, span.ptr, size, file_offset, buf_offset)
        return self._write_staged(span, size, file_offset, buf_offset)

    def _read_staged(self, span: Span, size: int, file_offset: int, buf_offset: int) -> int:
        if span.host.readonly:
            raise TypeError("cannot read into a read-only buffer")
        if size == 0:
            return 0
        stage = empty(size)
        count = _native.read(self._handle, stage.ptr, size, file_offset, 0)
        span.host[buf_offset:buf_offset + count] = memoryview(stage).cast("B")[:count]
        return count

    def _write_staged(self, span: Span, size: int, file_offset: int, buf_offset: int) -> int:
        if size == 0:
            return 0
        stage = empty(size)
        memoryview(stage).cast("B")[:] = span.host[buf_offset:buf_offset + size]
        return _native.write(self._handle, stage.ptr, size, file_offset, 0)

    # -- futures ------------------------------------------------------------------

    def pread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
              buf_offset: int = 0) -> concurrent.futures.Future:
        """``read`` on the I/O thread pool: a ``concurrent.futures.Future`` of the count."""
        return self._submit(self.read, buf, size, file_offset, buf_offset)

    def pwrite(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
               buf_offset: int = 0) -> concurrent.futures.Future:
        """``write`` on the I/O thread pool: a ``concurrent.futures.Future`` of the count."""
        return self._submit(self.write, buf, size, file_offset, buf_offset)

    def _submit(self, call, *args) -> concurrent.futures.Future:
        self._check_open()
        future = _executor().submit(call, *args)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(future)

    # -- stream-ordered -----------------------------------------------------------

    def read_async(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
                   buf_offset: int = 0, stream: Any = None) -> "_native.StreamFuture":
        """``hipFileReadAsync`` on ``stream``: returns a ``StreamFuture`` that owns the
        size/offset/result cells and ``buf``; ``.result()`` synchronizes the stream and
        returns the byte count or raises. Device memory only (no staging)."""
        return self._async(_native.read_async, buf, size, file_offset, buf_offset, stream)

    def write_async(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
                    buf_offset: int = 0, stream: Any = None) -> "_native.StreamFuture":
        """``hipFileWriteAsync`` on ``stream``; see :meth:`read_async`."""
        return self._async(_native.write_async, buf, size, file_offset, buf_offset, stream)

    def _async(self, call, buf, size, file_offset, buf_offset, stream):
        self._check_open()
        span = resolve(buf)
        if span.host is not None:
            raise TypeError(
                "read_async/write_async need device memory (hipfile.empty or a GPU tensor); "
                "host buffers are staged only by the synchronous calls"
            )
        size = _size(span, size, buf_offset)
        return call(self._handle, span.ptr, size, file_offset, buf_offset,
                    stream_handle(stream), span.owner)


def _size(span: Span, size: Optional[int], buf_offset: int) -> int:
    if buf_offset < 0:
        raise ValueError(f"buf_offset must be >= 0, not {buf_offset}")
    if buf_offset > span.nbytes:
        raise ValueError(f"buf_offset {buf_offset} is beyond the buffer ({span.nbytes} bytes)")
    if size is None:
        return span.nbytes - buf_offset
    if size < 0:
        raise ValueError(f"size must be >= 0, not {size}")
    if size > span.nbytes - buf_offset:
        raise ValueError(
            f"size {size} at buf_offset {buf_offset} exceeds the buffer ({span.nbytes} bytes)"
        )
    return size


