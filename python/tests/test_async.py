import gc
import os
import time

import pytest

import hipfile


@pytest.fixture
def rw_file(data_file):
    path, data = data_file
    with hipfile.File(path, "r+") as file:
        yield file, path, data


def test_read_async_on_a_stream(rw_file, dev):
    file, _, data = rw_file
    stream = dev.stream()
    buf = dev.alloc(1 << 20)
    future = file.read_async(buf, 1 << 20, 4096, 0, stream)
    assert isinstance(future, hipfile.StreamFuture)
    assert future.result() == 1 << 20
    assert future.done() and future.bytes_done == 1 << 20
    assert dev.to_bytes(buf) == data[4096:4096 + (1 << 20)]


def test_many_async_reads_keep_stream_order_and_their_own_cells(rw_file, dev):
    file, _, data = rw_file
    stream = dev.stream()
    buf = dev.alloc(64 * 4096)
    futures = [file.read_async(buf, 4096, i * 8192, i * 4096, stream) for i in range(64)]
    assert [f.result() for f in futures] == [4096] * 64
    got = dev.to_bytes(buf)
    for i in range(64):
        assert got[i * 4096:(i + 1) * 4096] == data[i * 8192:i * 8192 + 4096]


def test_future_owns_cells_and_buffer_after_the_caller_dropped_them(rw_file, dev, cpu_only):
    file, _, data = rw_file
    stream = hipfile.Stream()
    gate = stream.pause()
    buf = hipfile.empty(8192)
    view = memoryview(buf)
    future = file.read_async(buf, 8192, 100, 0, stream)
    del buf  # the future keeps the buffer alive until the stream passed the op
    gc.collect()
    assert future.bytes_done == 0  # the stream has not reached the op
    assert not future.done()  # non-blocking: the held stream has not passed it
    gate.release()
    deadline = time.monotonic() + 30
    while not future.done():
        assert time.monotonic() < deadline, "the stream never passed the op"
        time.sleep(0.001)
    assert future.result() == 8192
    assert bytes(view) == data[100:100 + 8192]


def test_cells_are_read_when_the_stream_reaches_the_op(rw_file, cpu_only):
    file, _, data = rw_file
    stream = hipfile.Stream()
    hipfile.stream_register(stream.ptr, 0)  # no FIXED flags: cells bound at arm
    try:
        gate = stream.pause()
        buf = hipfile.empty(8192)
        future = file.read_async(buf, 7000, 0, 0, stream)
        future.size = 5000  # a size may shrink before arm, never grow
        future.file_offset = 3000
        future.buf_offset = 1000
        gate.release()
        assert future.result() == 5000
        assert bytes(buf)[1000:6000] == data[3000:8000]
        assert bytes(buf)[:1000] == bytes(1000)
    finally:
        hipfile.stream_deregister(stream.ptr)


def test_invalid_cells_at_arm_raise_from_result(rw_file, cpu_only):
    file, _, _ = rw_file
    stream = hipfile.Stream()
    hipfile.stream_register(stream.ptr, 0)
    try:
        gate = stream.pause()
        buf = hipfile.empty(4096)
        future = file.read_async(buf, 100, 0, 0, stream)
        future.size = 200  # grew after submission: refused at arm
        gate.release()
        with pytest.raises(hipfile.HipFileError) as excinfo:
            future.result()
        assert excinfo.value.code == 5022
    finally:
        hipfile.stream_deregister(stream.ptr)


def test_write_async_then_read_back(rw_file, dev):
    file, path, _ = rw_file
    payload = os.urandom(300_000)
    source = dev.alloc(len(payload))
    dev.fill(source, payload)
    stream = dev.stream()
    assert file.write_async(source, len(payload), 50_000, 0, stream).result() == len(payload)
    assert path.read_bytes()[50_000:50_000 + len(payload)] == payload


def test_null_stream_runs_at_once(rw_file, dev):
    file, _, data = rw_file
    buf = dev.alloc(4096)
    future = file.read_async(buf, 4096, 0, 0, None)
    assert future.bytes_done == 4096
    assert future.result() == 4096
    assert dev.to_bytes(buf) == data[:4096]


def test_stream_registration_errors(dev):
    stream_object = dev.stream()
    stream = hipfile.stream_handle(stream_object)
    hipfile.stream_register(stream, hipfile.STREAM_FIXED_ALL)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.stream_register(stream, 0)
    assert excinfo.value.code == 5022
    hipfile.stream_deregister(stream)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.stream_deregister(stream)
    assert excinfo.value.code == 5022
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.stream_register(stream, 0x10)
    assert excinfo.value.code == 5022


def test_async_submission_errors(rw_file, dev):
    file, _, _ = rw_file
    buf = dev.alloc(4096)
    ptr = hipfile.resolve(buf).ptr
    stream_object = dev.stream()
    stream = hipfile.stream_handle(stream_object)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.read_async(0xBAD0, ptr, 4096, 0, 0, stream)
    assert excinfo.value.code == 5027
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.read_async(file.handle, 0, 4096, 0, 0, stream)
    assert excinfo.value.code == 5022
    with pytest.raises(TypeError):
        file.read_async(bytearray(4096), 4096, 0, 0, stream)
    with pytest.raises(TypeError):
        file.read_async(buf, 4096, 0, 0, "not a stream")
