"""Turning Python objects into device spans and stream handles.

Buffers, in the order they are tried:

1. :class:`hipfile.DeviceBuffer` (cpu-device memory from :func:`hipfile.empty`);
2. torch tensors on a GPU (``data_ptr()``, contiguous);
3. anything with ``__cuda_array_interface__`` (cupy, numba, torch, ...), C-contiguous;
4. anything with ``__dlpack__`` on a CUDA / ROCm device (DLPack capsule);
5. the buffer protocol (numpy arrays, bytearray, memoryview, CPU torch tensors via
   ``numpy()``): **host** memory, which the driver refuses. ``hipfile.File`` stages it
   through a cpu-device buffer (one extra copy); the low-level calls take addresses.

Streams: ``None`` (the NULL stream), an ``int``, or an object with ``cuda_stream``
(torch) or ``ptr`` (cupy, :class:`hipfile.Stream`).
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple, Optional

from ._memory import DeviceBuffer


class Span(NamedTuple):
    """A resolved buffer: ``nbytes`` bytes at ``ptr``."""

    ptr: int
    nbytes: int
    owner: Any
    host: Optional[memoryview]  # set for host memory (the bytes, as 'B')


_TYPESTR_SIZES = {"b1": 1, "i1": 1, "u1": 1, "i2": 2, "u2": 2, "f2": 2, "i4": 4, "u4": 4,
                  "f4": 4, "i8": 8, "u8": 8, "f8": 8, "c8": 8, "c16": 16}


def resolve(buf: Any) -> Span:
    """The span of ``buf`` (see the module docs); TypeError/ValueError when unusable."""
    if isinstance(buf, DeviceBuffer):
        return Span(buf.ptr, buf.nbytes, buf, None)
    if _is_torch_tensor(buf) and buf.device.type != "cpu":
        return _torch_span(buf)
    interface = getattr(buf, "__cuda_array_interface__", None)
    if interface is not None:
        return _cuda_array_span(buf, interface)
    if hasattr(buf, "__dlpack__") and hasattr(buf, "__dlpack_device__"):
        device_type, _ = buf.__dlpack_device__()
        if int(device_type) in _DLPACK_GPU_DEVICES:
            return _dlpack_span(buf)
    if _is_torch_tensor(buf):
        buf = buf.detach().contiguous().view(-1).view(_torch_uint8()).numpy()
    return _host_span(buf)


def wait_for_producer(span: Span) -> None:
    """Waits until the work queued on a GPU buffer's stream is done, so that a
    synchronous read lands after it (and is not overwritten by a pending fill such as
    ``torch.zeros``) and a synchronous write sees its result (``t = model(x);
    file.write(t)``): the engine copies on streams of its own, which do not wait for the
    application's. Torch tensors: the device's current stream (what torch's own
    ``.cpu()`` orders after); ``__cuda_array_interface__``: its ``stream`` (v3), when given;
    DLPack capsules on CUDA: the legacy default stream, which the producer made the data
    ready on. Host and cpu-device buffers have nothing pending."""
    owner = span.owner
    if span.host is not None or isinstance(owner, DeviceBuffer):
        return
    if _is_torch_tensor(owner) and owner.device.type != "cpu":
        import torch

        torch.cuda.current_stream(owner.device).synchronize()
        return
    from . import _native

    interface = getattr(owner, "__cuda_array_interface__", None)
    if interface is not None:
        stream = interface.get("stream")
        if stream:
            _native.stream_synchronize(int(stream))
        return
    if isinstance(owner, _DLPackOwner) and owner.device_type == _DLPACK_CUDA:
        _native.stream_synchronize(_CUDA_LEGACY_STREAM)


def _is_torch_tensor(buf: Any) -> bool:
    return type(buf).__module__.startswith("torch") and hasattr(buf, "data_ptr")


def _torch_uint8():
    import torch

    return torch.uint8


def _torch_span(tensor) -> Span:
    if not tensor.is_contiguous():
        raise ValueError("hipfile needs a contiguous tensor (call .contiguous() first)")
    nbytes = tensor.numel() * tensor.element_size()
    return Span(int(tensor.data_ptr()), nbytes, tensor, None)


def _cuda_array_span(buf: Any, interface: dict) -> Span:
    ptr = int(interface["data"][0])
    shape = tuple(interface["shape"])
    typestr = interface["typestr"]
    itemsize = _TYPESTR_SIZES.get(typestr[1:])
    if itemsize is None:
        raise TypeError(f"unsupported __cuda_array_interface__ typestr {typestr!r}")
    strides = interface.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, itemsize):
        raise ValueError("hipfile needs a C-contiguous array")
    count = 1
    for dim in shape:
        count *= dim
    return Span(ptr, count * itemsize, buf, None)


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def _host_span(buf: Any) -> Span:
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(
            f"{type(buf).__name__} is not a buffer: pass a hipfile.DeviceBuffer, a GPU tensor "
            "(__cuda_array_interface__ / __dlpack__) or a buffer-protocol object"
        ) from None
    if not view.c_contiguous:
        raise ValueError("hipfile needs a C-contiguous buffer")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    ptr = 0
    if view.nbytes and not view.readonly:
        ptr = ctypes.addressof(ctypes.c_ubyte.from_buffer(view))
    return Span(ptr, view.nbytes, buf, view)


# DLPack: kDLCUDA = 2, kDLCUDAManaged = 13, kDLROCM = 10.
_DLPACK_CUDA = 2
_DLPACK_GPU_DEVICES = {_DLPACK_CUDA, 10}
# CUDA's CU_STREAM_LEGACY: the legacy default stream, which DLPack's stream=None names.
_CUDA_LEGACY_STREAM = 1


class _DLPackOwner(NamedTuple):
    """What keeps a DLPack buffer alive during I/O: the object and its capsule."""

    buf: Any
    capsule: Any
    device_type: int


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _dlpack_span(buf: Any) -> Span:
    capsule = buf.__dlpack__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    # The capsule stays unconsumed and owns the DLManagedTensor (its DLTensor comes
    # first); we keep the capsule with the span, so the tensor outlives the I/O.
    tensor = _DLTensor.from_address(get_pointer(capsule, b"dltensor"))
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    itemsize = (tensor.dtype.bits * tensor.dtype.lanes + 7) // 8
    if tensor.strides:
        strides = tuple(tensor.strides[i] * itemsize for i in range(tensor.ndim))
        if strides != _c_strides(tuple(shape), itemsize):
            raise ValueError("hipfile needs a C-contiguous array")
    count = 1
    for dim in shape:
        count *= dim
    owner = _DLPackOwner(buf, capsule, int(tensor.device.device_type))
    return Span(int(tensor.data or 0) + tensor.byte_offset, count * itemsize, owner, None)


def stream_handle(stream: Any) -> int:
    """The integer handle of ``stream`` (see the module docs)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("a stream must be None, an int or a stream object, not bool")
    if isinstance(stream, int):
        return stream
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    raise TypeError(
        f"{type(stream).__name__} is not a stream: pass None, an int, a torch/cupy stream "
        "or a hipfile.Stream"
    )
