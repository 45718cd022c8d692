import errno
import os

import pytest

import hipfile


@pytest.fixture
def driver():
    hipfile.driver_open()
    yield
    hipfile.driver_close()


def test_negative_fd_is_refused_with_a_code(driver):
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.handle_register(-1)
    assert excinfo.value.code == 5030
    assert excinfo.value.name == "hipFileInternalError"


def test_closed_fd_is_refused(driver, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.handle_register(fd)
    assert excinfo.value.code == 5030


def test_a_pipe_is_not_a_file_hipfile_supports(driver):
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(hipfile.HipFileError) as excinfo:
            hipfile.handle_register(read_end)
        assert excinfo.value.code == 5008
    finally:
        os.close(read_end)
        os.close(write_end)


def test_double_registration_is_5028(driver, data_file):
    path, _ = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        fh = hipfile.handle_register(fd)
        assert fh != 0
        with pytest.raises(hipfile.HipFileError) as excinfo:
            hipfile.handle_register(fd)
        assert excinfo.value.code == 5028
        hipfile.handle_deregister(fh)
        fh = hipfile.handle_register(fd)  # registrable again once deregistered
        hipfile.handle_deregister(fh)
    finally:
        os.close(fd)


def test_unregistered_handles_are_5027(driver, dev, data_file):
    path, _ = data_file
    buf = dev.alloc(4096)
    ptr = hipfile.resolve(buf).ptr
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.read(0xDEAD0, ptr, 4096, 0, 0)
    assert excinfo.value.code == 5027
    fd = os.open(path, os.O_RDONLY)
    fh = hipfile.handle_register(fd)
    hipfile.handle_deregister(fh)
    hipfile.handle_deregister(fh)  # unknown handles are ignored, as in hipFile
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.read(fh, ptr, 4096, 0, 0)
    assert excinfo.value.code == 5027
    os.close(fd)


def test_buffer_registration_errors(driver, dev):
    buf = dev.alloc(8192)
    ptr = hipfile.resolve(buf).ptr
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.buf_register(0, 4096)
    assert excinfo.value.code == 5022
    hipfile.buf_register(ptr, 8192)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.buf_register(ptr, 8192)
    assert excinfo.value.code == 5023
    hipfile.buf_deregister(ptr)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.buf_deregister(ptr)
    assert excinfo.value.code == 5024


def test_buffer_range_beyond_the_allocation_is_5014(driver, cpu_only):
    buf = hipfile.empty(8192)
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.buf_register(buf.ptr + 4096, 8192)
    assert excinfo.value.code == 5014


def test_host_memory_is_5013(driver, data_file):
    path, _ = data_file
    host = bytearray(4096)
    span = hipfile.resolve(host)
    assert span.host is not None and span.ptr != 0
    with pytest.raises(hipfile.HipFileError) as excinfo:
        hipfile.buf_register(span.ptr, 4096)
    assert excinfo.value.code == 5013
    fd = os.open(path, os.O_RDONLY)
    fh = hipfile.handle_register(fd)
    try:
        with pytest.raises(hipfile.HipFileError) as excinfo:
            hipfile.read(fh, span.ptr, 4096, 0, 0)
        assert excinfo.value.code == 5013
        assert bytes(host) == bytes(4096)
    finally:
        hipfile.handle_deregister(fh)
        os.close(fd)


def test_null_pointer_read_is_5022(driver, data_file):
    path, _ = data_file
    fd = os.open(path, os.O_RDONLY)
    fh = hipfile.handle_register(fd)
    try:
        with pytest.raises(hipfile.HipFileError) as excinfo:
            hipfile.read(fh, 0, 4096, 0, 0)
        assert excinfo.value.code == 5022
    finally:
        hipfile.handle_deregister(fh)
        os.close(fd)


def test_negative_size_is_refused_before_reaching_the_driver(driver):
    with pytest.raises(OverflowError):
        hipfile.read(1, 1, -5, 0, 0)


def test_writing_through_a_read_only_descriptor_is_ebadf(driver, dev, data_file):
    path, _ = data_file
    buf = dev.alloc(4096)
    fd = os.open(path, os.O_RDONLY)
    fh = hipfile.handle_register(fd)
    try:
        with pytest.raises(OSError) as excinfo:
            hipfile.write(fh, hipfile.resolve(buf).ptr, 4096, 0, 0)
        assert excinfo.value.errno == errno.EBADF
    finally:
        hipfile.handle_deregister(fh)
        os.close(fd)
