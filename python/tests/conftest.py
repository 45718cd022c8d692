"""Shared fixtures: the same tests run on the cpu device (hipfile.empty / hipfile.Stream)
and, under gpu-test.sh, on CUDA with torch tensors and torch streams."""

import os

import pytest

import hipfile


class CpuDevice:
    """Device memory and streams of hipfile's in-process cpu device."""

    name = "cpu"

    def alloc(self, nbytes):
        return hipfile.empty(nbytes)

    def to_bytes(self, buf):
        return bytes(buf)

    def fill(self, buf, data):
        memoryview(buf).cast("B")[: len(data)] = data

    def stream(self):
        return hipfile.Stream()


class TorchGpuDevice:
    """Device memory and streams of torch on a GPU."""

    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch

    def alloc(self, nbytes):
        buf = self.torch.zeros(nbytes, dtype=self.torch.uint8, device="cuda")
        # The zero fill is queued on torch's stream; the low-level calls, like
        # hipFileRead, do not wait for it (hipfile.File does).
        self.torch.cuda.synchronize()
        return buf

    def to_bytes(self, buf):
        self.torch.cuda.synchronize()
        return buf.cpu().numpy().tobytes()

    def fill(self, buf, data):
        source = self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8)
        buf[: len(data)].copy_(source)
        self.torch.cuda.synchronize()

    def stream(self):
        return self.torch.cuda.Stream()


@pytest.fixture(scope="session")
def dev():
    if hipfile.device_kind() == "cpu":
        return CpuDevice()
    return TorchGpuDevice()


@pytest.fixture
def cpu_only():
    if hipfile.device_kind() != "cpu":
        pytest.skip("cpu-device test")


@pytest.fixture
def data_file(tmp_path):
    """A file of 3 MiB + 123 bytes of random data: (path, bytes)."""
    data = os.urandom((3 << 20) + 123)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data


def error_code(excinfo):
    return excinfo.value.code
