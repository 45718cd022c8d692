"""cpu-device memory for Python: ``hipfile.empty(nbytes)`` -> :class:`DeviceBuffer`.

The driver accepts only device memory of its device. On the in-process ``cpu`` device
that memory is host memory the device allocated (``CpuDevice::malloc_device``), so a
:class:`DeviceBuffer` exposes it through the buffer protocol: ``memoryview(buf)``,
``bytes(buf)`` and ``numpy.frombuffer(buf, dtype)`` are zero-copy views that keep the
allocation alive. The memory is freed when the last view and the buffer are gone.

The extension is built for the stable ABI of Python 3.9, which cannot define the
buffer protocol itself (that needs 3.11's limited API); a ``DeviceBuffer`` is therefore
a ``ctypes`` array placed over the allocation, which holds the allocation object.
"""

from __future__ import annotations

import ctypes
import functools

from . import _native


class DeviceBuffer:
    """Device memory of the cpu device, usable wherever a buffer is expected.

    Instances are ``ctypes.c_ubyte`` arrays (made by :func:`empty`); ``ptr`` is the
    device address, ``nbytes`` the length, ``device`` the ordinal.
    """

    __slots__ = ()

    @property
    def ptr(self) -> int:
        """Device address of the first byte."""
        return ctypes.addressof(self)

    @property
    def nbytes(self) -> int:
        """Length in bytes."""
        return ctypes.sizeof(self)

    @property
    def device(self) -> int:
        """The device ordinal."""
        return self._memory.device

    def numpy(self, dtype="uint8", shape=None):
        """A zero-copy numpy view (needs numpy)."""
        import numpy

        array = numpy.frombuffer(self, dtype=dtype)
        return array if shape is None else array.reshape(shape)

    def __repr__(self) -> str:
        return f"DeviceBuffer(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, device={self.device})"


@functools.lru_cache(maxsize=256)
def _buffer_type(nbytes: int) -> type:
    # A ctypes array type has a fixed length; one subclass per size, cached.
    return type("DeviceBuffer", (ctypes.c_ubyte * nbytes, DeviceBuffer), {"__slots__": ("_memory",)})


def empty(nbytes: int, device: int = 0) -> DeviceBuffer:
    """Allocates ``nbytes`` (>= 1) of zero-filled cpu-device memory on ``device``.

    Raises ``HipFileError(5009)`` on a GPU device (allocate with torch or cupy there) and
    ``HipFileError(5011)`` for a size of 0, an invalid ordinal or no memory.
    """
    if not isinstance(nbytes, int) or isinstance(nbytes, bool):
        raise TypeError(f"nbytes must be an int, not {type(nbytes).__name__}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, not {nbytes}")
    memory = _native.DeviceMemory(nbytes, device)
    buffer = _buffer_type(nbytes).from_address(memory.ptr)
    buffer._memory = memory
    return buffer


device_buffer = empty
