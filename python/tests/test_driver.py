import os
import subprocess
import sys

import hipfile


def test_open_and_close_move_the_use_count():
    before = hipfile.use_count()
    hipfile.driver_open()
    hipfile.driver_open()
    assert hipfile.use_count() == before + 2
    hipfile.driver_close()
    assert hipfile.use_count() == before + 1
    hipfile.driver_close()
    assert hipfile.use_count() == before


def test_close_at_zero_raises_5001_and_close_to_zero_deregisters_handles():
    # In a fresh process: the count starts at 0 there.
    code = """
import os, tempfile, hipfile
assert hipfile.use_count() == 0
try:
    hipfile.driver_close()
    raise SystemExit("no error")
except hipfile.HipFileError as e:
    assert e.code == 5001, e.code
fd, path = tempfile.mkstemp()
os.write(fd, b"x" * 4096)
hipfile.driver_open()
fh = hipfile.handle_register(fd)
buf = hipfile.empty(4096)
assert hipfile.read(fh, buf.ptr, 4096) == 4096
hipfile.driver_close()
assert hipfile.use_count() == 0
hipfile.driver_open()
try:
    hipfile.read(fh, buf.ptr, 4096)
    raise SystemExit("handle survived the close")
except hipfile.HipFileError as e:
    assert e.code == 5027, e.code
os.unlink(path)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, HIPFILE_DEVICE="cpu"))
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stdout.strip() == "ok"
