"""Parameters and driver properties (hipFileGet/SetParameter*, hipFileDriverGetProperties,
hipFileDriverSet*). Settings apply until the engine starts or a file is registered, so
the checks that set run in a fresh process."""

import subprocess
import sys

import pytest

import hipfile
from hipfile import BoolConfigParameter as B
from hipfile import SizeTConfigParameter as S
from hipfile import StringConfigParameter as T


def test_every_key_reads_and_unknown_keys_are_5022():
    for key in S:
        assert hipfile.get_parameter_size_t(key) >= 0
    for key in B:
        assert hipfile.get_parameter_bool(key) in (True, False)
    for key in T:
        assert isinstance(hipfile.get_parameter_string(key), str)
    assert hipfile.get_parameter_size_t(S.PROPERTIES_IO_BATCHSIZE) == 128
    assert hipfile.get_parameter_bool(B.FORCE_COMPAT_MODE) is True
    for get in (hipfile.get_parameter_size_t, hipfile.get_parameter_bool,
                hipfile.get_parameter_string):
        with pytest.raises(hipfile.HipFileError) as excinfo:
            get(99)
        assert excinfo.value.code == 5022


def test_properties_need_an_open_driver_and_match_the_parameters():
    code = """
import hipfile
from hipfile import SizeTConfigParameter as S
try:
    hipfile.driver_get_properties()
    raise SystemExit("properties of a closed driver")
except hipfile.HipFileError as e:
    assert e.code == 5001, e.code
hipfile.driver_open()
p = hipfile.driver_get_properties()
assert (p["major_version"], p["minor_version"]) == (0, 2), p
assert p["max_direct_io_size_kb"] == hipfile.get_parameter_size_t(S.PROPERTIES_MAX_DIRECT_IO_SIZE_KB)
assert p["max_device_pinned_mem_size_kb"] == hipfile.get_parameter_size_t(S.PROPERTIES_MAX_DEVICE_PINNED_MEM_SIZE_KB)
assert p["max_batch_io_count"] == 128 and p["driver_status_flags"] == 0, p
assert p["feature_flags"] & (1 << 1 | 1 << 2) == (1 << 1 | 1 << 2), p   # batch, streams
hipfile.driver_close()
"""
    run(code)


def test_settings_apply_until_a_file_is_registered(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 8192)
    code = f"""
import os, hipfile
from hipfile import BoolConfigParameter as B, SizeTConfigParameter as S, StringConfigParameter as T
def code_of(call, *args):
    try:
        call(*args)
    except hipfile.HipFileError as e:
        return e.code
    return 0
hipfile.driver_open()
hipfile.set_parameter_size_t(S.EXECUTION_MAX_IO_QUEUE_DEPTH, 8)
assert hipfile.get_parameter_size_t(S.EXECUTION_MAX_IO_QUEUE_DEPTH) == 8
assert code_of(hipfile.set_parameter_size_t, S.EXECUTION_MAX_IO_QUEUE_DEPTH, 0) == 5022
assert code_of(hipfile.set_parameter_size_t, S.PROPERTIES_IO_BATCHSIZE, 64) == 5022   # read-only
hipfile.set_parameter_size_t(S.PROPERTIES_IO_BATCHSIZE, 128)                          # its own value
hipfile.driver_set_max_direct_io_size(2048)
assert hipfile.driver_get_properties()["max_direct_io_size_kb"] == 2048
assert code_of(hipfile.driver_set_max_direct_io_size, 3000) == 5022                   # not a power of two
assert code_of(hipfile.driver_set_poll_mode, False, 2048) == 5022
hipfile.driver_set_poll_mode(True, 2048)
assert code_of(hipfile.set_parameter_bool, B.FORCE_COMPAT_MODE, False) == 5022
hipfile.set_parameter_bool(B.PROPERTIES_ALLOW_COMPAT_MODE, True)
hipfile.set_parameter_string(T.LOGGING_LEVEL, "info")
assert hipfile.get_parameter_string(T.LOGGING_LEVEL) == "INFO"
assert code_of(hipfile.set_parameter_string, T.LOGGING_LEVEL, "loud") == 5022
hipfile.set_parameter_string(T.LOGGING_LEVEL, "warn")
fd = os.open({str(path)!r}, os.O_RDWR)
fh = hipfile.handle_register(fd)
# Registered: settings that shape the engine are refused, nothing changes.
assert code_of(hipfile.set_parameter_size_t, S.EXECUTION_MAX_IO_QUEUE_DEPTH, 4) == 5026
assert code_of(hipfile.driver_set_max_cache_size, 1 << 20) == 5026
assert hipfile.get_parameter_size_t(S.EXECUTION_MAX_IO_QUEUE_DEPTH) == 8
hipfile.handle_deregister(fh)
os.close(fd)
hipfile.driver_close()
"""
    run(code)


def run(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
