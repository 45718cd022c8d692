import os

import pytest

import hipfile
from hipfile import IOParams, OpCode, Status


@pytest.fixture
def registered(data_file):
    path, data = data_file
    with hipfile.File(path, "r+") as file:
        yield file.handle, path, data


def test_batch_reads_complete_with_their_cookies(registered, dev):
    fh, _, data = registered
    buf = dev.alloc(16 * 8192)
    ptr = hipfile.resolve(buf).ptr
    batch = hipfile.batch_io_set_up(16)
    params = [IOParams(OpCode.READ, fh, ptr, i * 100_000, 8192, i * 8192, ("entry", i))
              for i in range(16)]
    hipfile.batch_io_submit(batch, params)
    events = []
    while len(events) < 16:
        events += hipfile.batch_io_get_status(batch, 16 - len(events), timeout=30)
    assert sorted(e.cookie for e in events) == [("entry", i) for i in range(16)]
    assert all(e.status == Status.COMPLETE and e.ret == 8192 for e in events)
    got = dev.to_bytes(buf)
    for i in range(16):
        assert got[i * 8192:(i + 1) * 8192] == data[i * 100_000:i * 100_000 + 8192]
    assert batch.outstanding() == 0
    hipfile.batch_io_destroy(batch)


def test_batch_write_and_short_read(registered, dev):
    fh, path, data = registered
    payload = os.urandom(4096)
    source = dev.alloc(8192)
    dev.fill(source, payload)
    ptr = hipfile.resolve(source).ptr
    batch = hipfile.Batch(4)
    hipfile.batch_io_submit(batch, [IOParams(OpCode.WRITE, fh, ptr, 8192, 4096, 0, "w")])
    (event,) = hipfile.batch_io_get_status(batch, 1, timeout=30)
    assert (event.cookie, event.status, event.ret) == ("w", Status.COMPLETE, 4096)
    assert path.read_bytes()[8192:8192 + 4096] == payload
    hipfile.batch_io_submit(batch, [IOParams(OpCode.READ, fh, ptr, len(data) - 10, 4096, 4096, 7)])
    (event,) = hipfile.batch_io_get_status(batch, 1, timeout=30)
    assert (event.cookie, event.status, event.ret) == (7, Status.COMPLETE, 10)
    assert dev.to_bytes(source)[4096:4106] == data[-10:]


def test_batch_submission_is_all_or_nothing(registered, dev):
    fh, _, _ = registered
    buf = dev.alloc(8192)
    ptr = hipfile.resolve(buf).ptr
    batch = hipfile.Batch(4)
    good = IOParams(OpCode.READ, fh, ptr, 0, 4096)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        batch.submit([tuple(good), tuple(IOParams(OpCode.READ, 0xBAD0, ptr, 0, 4096))])
    assert excinfo.value.code == 5027
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.batch_io_submit(batch, [good] * 5)  # more than the capacity
    assert excinfo.value.code == 5022
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.batch_io_submit(batch, [IOParams(OpCode.READ, fh, ptr, -1, 4096)])
    assert excinfo.value.code == 5022
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.batch_io_submit(batch, [IOParams(5, fh, ptr, 0, 4096)])
    assert excinfo.value.code == 5022
    assert batch.outstanding() == 0
    assert hipfile.batch_io_get_status(batch, 0, timeout=0) == []


def test_batch_capacity_limits():
    for capacity in (0, 129):
        with pytest.raises(hipfile.HipFileError) as excinfo:
            hipfile.batch_io_set_up(capacity)
        assert excinfo.value.code == 5022
    hipfile.batch_io_set_up(128).destroy()


def test_batch_cancel_empties_it_and_destroy_ends_it(registered, dev):
    fh, _, _ = registered
    buf = dev.alloc(64 * 65536)
    ptr = hipfile.resolve(buf).ptr
    batch = hipfile.Batch(64)
    hipfile.batch_io_submit(batch, [IOParams(OpCode.READ, fh, ptr, 0, 65536, i * 65536, i)
                                    for i in range(64)])
    hipfile.batch_io_cancel(batch)
    assert batch.outstanding() == 0
    assert hipfile.batch_io_get_status(batch, 64, timeout=0) == []
    hipfile.batch_io_destroy(batch)
    hipfile.batch_io_destroy(batch)  # twice: a no-op
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.batch_io_submit(batch, [IOParams(OpCode.READ, fh, ptr, 0, 4096)])
    assert excinfo.value.code == 5022


def test_negative_timeout_is_refused():
    batch = hipfile.Batch(1)
    with pytest.raises(hipfile.HipFileError):
        batch.status(1, 1, -1.0)
