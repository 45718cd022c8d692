import os
import subprocess
import sys

import hipfile


def run_python(code, **env):
    environment = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=120)


def test_import_touches_no_device_and_auto_falls_back_to_cpu_without_a_gpu():
    # No device library is loaded at import; `auto` picks cpu when no GPU is found.
    code = (
        "import sys, hipfile\n"
        "assert 'torch' not in sys.modules\n"
        "print(hipfile.device_kind())\n"
    )
    result = run_python(code, HIPFILE_DEVICE="auto", CUDA_VISIBLE_DEVICES="",
                        HIP_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("cpu", "cuda", "rocm")
    if not os.path.exists("/dev/nvidia0") and not os.path.exists("/dev/kfd"):
        assert result.stdout.strip() == "cpu"


def test_import_succeeds_when_the_selected_device_is_missing_and_the_first_call_raises():
    if os.path.exists("/dev/nvidia0"):
        import pytest

        pytest.skip("a CUDA GPU is present")
    code = (
        "import hipfile\n"
        "try:\n"
        "    hipfile.driver_open()\n"
        "except hipfile.HipFileError as e:\n"
        "    print(e.code, e.name)\n"
    )
    result = run_python(code, HIPFILE_DEVICE="cuda")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["5029", "hipFileDeviceNotFound"]


def test_error_strings_match_hipfile():
    assert hipfile.get_op_error_string(5022) == "One or more arguments have an invalid value"
    assert hipfile.get_op_error_string(4242) == "Unknown hipFile error"


def test_module_exports_the_c_api_names():
    for name in ["driver_open", "driver_close", "use_count", "handle_register",
                 "handle_deregister", "buf_register", "buf_deregister", "read", "write",
                 "read_async", "write_async", "stream_register", "stream_deregister",
                 "batch_io_set_up", "batch_io_submit", "batch_io_get_status",
                 "batch_io_cancel", "batch_io_destroy"]:
        assert callable(getattr(hipfile, name)), name
    assert issubclass(hipfile.HipFileError, Exception)
