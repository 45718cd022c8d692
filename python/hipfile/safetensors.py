"""A safetensors loader reading each tensor straight into device memory.

``load_file(path, device="cuda:0")`` returns ``{name: tensor}`` like
``safetensors.torch.load_file``; ``iter_file(path, device, memory_budget_bytes)`` yields
``(name, tensor)`` group by group, never allocating more than the budget ahead of what
it has yielded (a tensor larger than the budget is loaded alone).

The header is parsed here (8-byte little-endian length, then JSON); each tensor is
allocated on the device (torch) and its byte range read into it by the hipfile engine,
the reads of a group running concurrently. torch is imported only when used.

``device="cpu-device"`` loads into memory of hipfile's in-process cpu device: numpy
arrays by default (``BF16`` comes back as ``uint16`` and ``F8_*`` as ``uint8``, the raw
bits, as numpy has no such types), or torch tensors with ``framework="torch"``.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

from ._file import File
from ._memory import empty

CPU_DEVICE = "cpu-device"

# safetensors dtype -> (bytes per element, torch dtype name, numpy dtype name)
_DTYPES = {
    "F64": (8, "float64", "float64"),
    "F32": (4, "float32", "float32"),
    "F16": (2, "float16", "float16"),
    "BF16": (2, "bfloat16", "uint16"),
    "I64": (8, "int64", "int64"),
    "I32": (4, "int32", "int32"),
    "I16": (2, "int16", "int16"),
    "I8": (1, "int8", "int8"),
    "U64": (8, "uint64", "uint64"),
    "U32": (4, "uint32", "uint32"),
    "U16": (2, "uint16", "uint16"),
    "U8": (1, "uint8", "uint8"),
    "BOOL": (1, "bool", "bool"),
    "F8_E4M3": (1, "float8_e4m3fn", "uint8"),
    "F8_E5M2": (1, "float8_e5m2", "uint8"),
}

_MAX_HEADER_BYTES = 100 << 20


class TensorInfo(NamedTuple):
    """One tensor of the file: its byte range relative to the file start."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    file_offset: int
    nbytes: int


def read_header(path: "os.PathLike[str] | str") -> Tuple[List[TensorInfo], Dict[str, str]]:
    """The tensors of ``path`` (in file order) and its ``__metadata__``.

    Raises ``ValueError`` for a malformed header (sizes, offsets, dtypes, shapes).
    """
    with open(path, "rb") as file:
        file_size = os.fstat(file.fileno()).st_size
        prefix = file.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_MAX_HEADER_BYTES, file_size - 8):
            raise ValueError(f"{path}: header length {header_len} is invalid")
        header = json.loads(file.read(header_len))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_len
    tensors = [_tensor_info(path, name, entry, data_start, file_size)
               for name, entry in header.items()]
    tensors.sort(key=lambda t: t.file_offset)
    return tensors, metadata


def _tensor_info(path, name: str, entry: Any, data_start: int, file_size: int) -> TensorInfo:
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"{path}: malformed header entry for {name!r}") from None
    if dtype not in _DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
    count = 1
    for dim in shape:
        if not isinstance(dim, int) or dim < 0:
            raise ValueError(f"{path}: tensor {name!r} has an invalid shape {shape}")
        count *= dim
    nbytes = count * _DTYPES[dtype][0]
    if not (0 <= begin <= end and end - begin == nbytes and data_start + end <= file_size):
        raise ValueError(f"{path}: tensor {name!r} has invalid data offsets {[begin, end]}")
    return TensorInfo(name, dtype, shape, data_start + begin, nbytes)


def load_file(path: "os.PathLike[str] | str", device: Any = "cuda:0",
              framework: Optional[str] = None) -> Dict[str, Any]:
    """All tensors of ``path`` on ``device``, as ``{name: tensor}``."""
    return dict(iter_file(path, device, None, framework))


def iter_file(path: "os.PathLike[str] | str", device: Any = "cuda:0",
              memory_budget_bytes: Optional[int] = None,
              framework: Optional[str] = None) -> Iterator[Tuple[str, Any]]:
    """Yields ``(name, tensor)`` in file order, loading groups of tensors of at most
    ``memory_budget_bytes`` (``None``: one group) with concurrent reads."""
    if memory_budget_bytes is not None and memory_budget_bytes <= 0:
        raise ValueError("memory_budget_bytes must be positive or None")
    allocate = _allocator(device, framework)
    tensors, _ = read_header(path)
    with File(path, "r") as file:
        for group in _groups(tensors, memory_budget_bytes):
            loaded = [(info, allocate(info)) for info in group]
            futures = [file.pread(target, info.nbytes, info.file_offset)
                       for info, (target, _) in loaded if info.nbytes]
            counts = [future.result() for future in futures]
            expected = [info.nbytes for info in group if info.nbytes]
            if counts != expected:
                raise OSError(f"{path}: short read (the file changed while loading?)")
            for info, (_, tensor) in loaded:
                yield info.name, tensor


def _groups(tensors: List[TensorInfo], budget: Optional[int]) -> Iterator[List[TensorInfo]]:
    group: List[TensorInfo] = []
    used = 0
    for info in tensors:
        if group and budget is not None and used + info.nbytes > budget:
            yield group
            group, used = [], 0
        group.append(info)
        used += info.nbytes
    if group:
        yield group


def _allocator(device: Any, framework: Optional[str]):
    """A function TensorInfo -> (read target, returned tensor) for ``device``."""
    if str(device) == CPU_DEVICE:
        if framework in (None, "numpy"):
            return _cpu_device_numpy
        if framework == "torch":
            return _cpu_device_torch
        raise ValueError(f"framework must be 'numpy' or 'torch', not {framework!r}")
    if framework not in (None, "torch"):
        raise ValueError(f"device {device!r} needs framework='torch'")
    import torch

    torch_device = torch.device(device)
    if torch_device.type == "cpu":
        raise ValueError(
            "device='cpu' is host memory, which hipfile does not read into: use a GPU "
            f"device, or {CPU_DEVICE!r} for hipfile's in-process cpu device"
        )

    def allocate(info: TensorInfo):
        tensor = torch.empty(info.shape, dtype=getattr(torch, _DTYPES[info.dtype][1]),
                             device=torch_device)
        return tensor, tensor

    return allocate


def _cpu_device_numpy(info: TensorInfo):
    import numpy

    buffer = empty(max(info.nbytes, 1))
    dtype = numpy.dtype(_DTYPES[info.dtype][2])
    array = numpy.frombuffer(buffer, dtype=dtype, count=info.nbytes // dtype.itemsize)
    return buffer, array.reshape(info.shape)


def _cpu_device_torch(info: TensorInfo):
    import torch

    buffer = empty(max(info.nbytes, 1))
    dtype = getattr(torch, _DTYPES[info.dtype][1])
    if info.nbytes == 0:
        return buffer, torch.empty(info.shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=torch.uint8, count=info.nbytes)
    return buffer, flat.view(dtype).reshape(info.shape)
