import json
import struct

import numpy as np
import pytest

import hipfile
import hipfile.safetensors as hst

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def sample_tensors():
    rng = np.random.default_rng(7)
    return {
        "embed.weight": rng.standard_normal((257, 129)).astype(np.float32),
        "layer.0.bias": rng.standard_normal(1001).astype(np.float16),
        "layer.0.weight": rng.standard_normal((64, 64, 3)).astype(np.float64),
        "ids": rng.integers(-2**40, 2**40, size=333, dtype=np.int64),
        "mask": rng.integers(0, 2, size=(7, 9)).astype(bool),
        "bytes": rng.integers(0, 255, size=4099, dtype=np.uint8),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "big": rng.standard_normal(3 << 18).astype(np.float32),  # 3 MiB
    }


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(sample_tensors(), str(path), metadata={"format": "np"})
    return path


def target_device():
    return "cpu-device" if hipfile.device_kind() == "cpu" else "cuda:0"


def as_numpy(tensor):
    if isinstance(tensor, np.ndarray):
        return tensor
    return tensor.cpu().numpy()


def test_header_is_parsed_like_safetensors(checkpoint):
    tensors, metadata = hst.read_header(checkpoint)
    assert metadata == {"format": "np"}
    expected = sample_tensors()
    assert {t.name for t in tensors} == set(expected)
    for info in tensors:
        assert info.shape == expected[info.name].shape
        assert info.nbytes == expected[info.name].nbytes


def test_load_file_is_bit_identical_to_safetensors(checkpoint):
    reference = safetensors_numpy.load_file(str(checkpoint))
    ours = hst.load_file(checkpoint, device=target_device())
    assert set(ours) == set(reference)
    for name, array in reference.items():
        got = as_numpy(ours[name])
        assert got.shape == array.shape, name
        assert got.dtype == array.dtype, name
        assert got.tobytes() == array.tobytes(), name


def test_iter_file_respects_the_memory_budget(checkpoint):
    reference = safetensors_numpy.load_file(str(checkpoint))
    tensors, _ = hst.read_header(checkpoint)
    budget = 1 << 20
    groups = list(hst._groups(tensors, budget))
    assert len(groups) > 1
    for group in groups:
        assert len(group) == 1 or sum(t.nbytes for t in group) <= budget
    names = []
    for name, tensor in hst.iter_file(checkpoint, target_device(), budget):
        names.append(name)
        assert as_numpy(tensor).tobytes() == reference[name].tobytes()
    assert names == [t.name for t in tensors]


def test_malformed_files_are_refused(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01")
    with pytest.raises(ValueError):
        hst.read_header(bad)
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(ValueError, match="data offsets"):
        hst.read_header(bad)
    header = json.dumps({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + bytes(1))
    with pytest.raises(ValueError, match="dtype"):
        hst.read_header(bad)
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        hst.read_header(bad)


def test_torch_tensors_are_bit_identical_including_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tensors = {
        "w": torch.randn(300, 77, dtype=torch.bfloat16),
        "b": torch.randn(1000, dtype=torch.float16),
        "i": torch.arange(12345, dtype=torch.int64),
    }
    path = tmp_path / "t.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    if hipfile.device_kind() == "cpu":
        ours = hst.load_file(path, device="cpu-device", framework="torch")
        reference = safetensors_torch.load_file(str(path))
    else:
        ours = hst.load_file(path, device="cuda:0")
        reference = safetensors_torch.load_file(str(path), device="cuda:0")
    for name, tensor in reference.items():
        assert ours[name].dtype == tensor.dtype
        assert ours[name].shape == tensor.shape
        assert torch.equal(ours[name].view(torch.uint8) if ours[name].dim() else ours[name],
                           tensor.view(torch.uint8) if tensor.dim() else tensor)
