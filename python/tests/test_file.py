import concurrent.futures
import os
import subprocess
import sys

import numpy as np
import pytest

import hipfile


def test_context_manager_registers_and_closes(data_file, dev):
    path, data = data_file
    # The first File of the process also takes the use kept between Files.
    hipfile.File(path).close()
    before = hipfile.use_count()
    assert before >= 1
    with hipfile.File(path) as file:
        assert hipfile.use_count() == before + 1
        buf = dev.alloc(len(data))
        assert file.read(buf) == len(data)
        assert dev.to_bytes(buf) == data
        handle = file.handle
    assert file.closed and hipfile.use_count() == before
    with pytest.raises(ValueError):
        file.read(buf)
    hipfile.driver_open()
    try:
        with pytest.raises(hipfile.HipFileError) as excinfo:
            hipfile.read(handle, hipfile.resolve(buf).ptr, 10)
        assert excinfo.value.code == 5027
    finally:
        hipfile.driver_close()


def test_read_defaults_size_to_the_rest_of_the_buffer_and_honours_offsets(data_file, dev):
    path, data = data_file
    with hipfile.File(path) as file:
        buf = dev.alloc(10_000)
        assert file.read(buf, file_offset=500, buf_offset=4000) == 6000
        assert dev.to_bytes(buf)[4000:] == data[500:6500]
        assert file.read(buf, size=10, file_offset=len(data) - 3) == 3
        with pytest.raises(ValueError):
            file.read(buf, size=10_001)
        with pytest.raises(ValueError):
            file.read(buf, size=1, buf_offset=-1)


def test_write_mode_creates_and_round_trips(tmp_path, dev):
    path = tmp_path / "new.bin"
    payload = os.urandom(1 << 20)
    source = dev.alloc(len(payload))
    dev.fill(source, payload)
    with hipfile.File(path, "w") as file:
        assert file.write(source) == len(payload)
    assert path.read_bytes() == payload
    with pytest.raises(FileExistsError):
        hipfile.File(path, "x")
    with pytest.raises(ValueError):
        hipfile.File(path, "a")


def test_numpy_host_buffers_are_staged(data_file, cpu_only):
    path, data = data_file
    with hipfile.File(path, "r+") as file:
        array = np.zeros(1000, dtype=np.uint32)
        assert file.read(array, file_offset=8) == 4000
        assert array.tobytes() == data[8:4008]
        source = np.arange(1000, dtype=np.uint64)
        assert file.write(source, file_offset=100) == 8000
        assert path.read_bytes()[100:8100] == source.tobytes()
        assert file.write(b"hello", file_offset=0) == 5
        with pytest.raises(TypeError):
            file.read(b"read-only bytes")
    assert path.read_bytes()[:5] == b"hello"


def test_device_buffer_views_are_zero_copy(data_file, cpu_only):
    path, data = data_file
    buf = hipfile.empty(4096)
    array = np.frombuffer(buf, dtype=np.uint8)
    with hipfile.File(path) as file:
        file.read(buf)
    assert array.tobytes() == data[:4096]  # the view sees the read: same memory
    del buf
    assert array.tobytes() == data[:4096]  # the view keeps the memory alive
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.empty(0)
    assert excinfo.value.code == 5011


def test_pread_futures_run_concurrently_and_return_counts(data_file, dev):
    path, data = data_file
    with hipfile.File(path) as file:
        bufs = [dev.alloc(65536) for _ in range(24)]
        futures = [file.pread(b, file_offset=i * 65536) for i, b in enumerate(bufs)]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        assert [f.result(timeout=60) for f in futures] == [65536] * 24
        for i, b in enumerate(bufs):
            assert dev.to_bytes(b) == data[i * 65536:(i + 1) * 65536]
        bad = file.pread(bufs[0], file_offset=-1)
        with pytest.raises(hipfile.HipFileError):
            bad.result(timeout=60)


def test_pwrite_future(tmp_path, dev):
    path = tmp_path / "w.bin"
    payload = os.urandom(70_000)
    source = dev.alloc(len(payload))
    dev.fill(source, payload)
    with hipfile.File(path, "w+") as file:
        assert file.pwrite(source, file_offset=10).result(timeout=60) == len(payload)
    assert path.read_bytes()[10:] == payload


def test_unknown_buffer_types_and_direct_values_are_refused(data_file):
    path, _ = data_file
    with hipfile.File(path) as file:
        with pytest.raises(TypeError):
            file.read(object())
    with pytest.raises(ValueError):
        hipfile.File(path, direct="sometimes")


def test_direct_is_chosen_per_file_and_explained(data_file, dev):
    path, _ = data_file
    with hipfile.File(path, direct=False) as file:
        why = file.explain()
        assert "O_DIRECT [slower]: no (turned off" in why, why
    buf = dev.alloc(4096)
    with hipfile.File(path, direct="auto") as file:
        why = file.explain(buf)
        assert "buffer:" in why and "device memory" in why, why
        assert "turned off" not in why, why
    with pytest.raises(hipfile.HipFileError) as error:
        hipfile.explain_path(0x1234_5670)
    assert error.value.code == 5027


def test_the_driver_stays_open_between_files_until_exit(tmp_path):
    # In a fresh process: the engine starts once, not at every File.
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 8192)
    code = f"""
import hipfile
assert hipfile.use_count() == 0
for _ in range(3):
    with hipfile.File({str(path)!r}) as file:
        assert hipfile.use_count() == 2
        buf = hipfile.empty(8192) if hipfile.device_kind() == "cpu" else None
        if buf is not None:
            assert file.read(buf) == 8192
    assert hipfile.use_count() == 1
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_sync_io_waits_for_work_queued_on_the_tensor(tmp_path, dev):
    if dev.name != "torch":
        pytest.skip("GPU test: the cpu device has no pending producer work")
    torch = dev.torch
    payload = os.urandom(4 << 20)
    path = tmp_path / "data.bin"
    path.write_bytes(payload)
    with hipfile.File(path, "r+") as file:
        # A fill queued behind a long GPU spin: the read must land after it.
        buf = torch.empty(len(payload), dtype=torch.uint8, device="cuda")
        torch.cuda._sleep(50_000_000)
        buf.fill_(7)
        assert file.read(buf) == len(payload)
        assert dev.to_bytes(buf) == payload
        # A result computed behind a spin: the write must see it.
        torch.cuda._sleep(50_000_000)
        result = torch.full((1 << 20,), 9, dtype=torch.uint8, device="cuda")
        assert file.write(result, file_offset=0) == 1 << 20
    assert path.read_bytes()[: 1 << 20] == bytes([9]) * (1 << 20)
