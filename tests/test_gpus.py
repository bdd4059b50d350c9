"""jaxflowers.host.gpus: CUDA_VISIBLE_DEVICES read as CUDA reads it (the sweep and the monitor)."""
import pytest

from jaxflowers.host import gpus
from jaxflowers.sweep import slots as devices

PHYSICAL = [("0", "GPU-aaaa-1111"), ("1", "GPU-bbbb-2222"), ("2", "GPU-bbbb-3333")]


@pytest.mark.parametrize("mask, expected", [
    (None, [("0", 0), ("1", 1), ("2", 2)]), ("1", [("1", 1)]), ("2,0", [("2", 2), ("0", 0)]),
    ("GPU-bbbb-2", [("GPU-bbbb-2", 1)]), (" 1 , GPU-aaaa", [("1", 1), ("GPU-aaaa", 0)]),
    ("", []), ("-1", []), ("0,7,1", [("0", 0)]),
    ("GPU-bbbb,0", []),  # an ambiguous UUID prefix names no GPU, and hides what follows
    ("MIG-4f1a,0", []), ("0,nonsense,1", [("0", 0)])])
def test_visible_gpus_follow_cuda_visible_devices(mask, expected):
    assert gpus.cuda_order(mask, PHYSICAL) == expected
    environ = {} if mask is None else {"CUDA_VISIBLE_DEVICES": mask}
    assert devices.visible_gpus(environ, PHYSICAL) == [token for token, _ in expected]


def test_uuid_prefixes_must_name_one_gpu():
    assert gpus.uuid_position("GPU-aaaa", PHYSICAL) == 0
    assert gpus.uuid_position("GPU-bbbb", PHYSICAL) is None
    assert gpus.uuid_position("GPU-ffff", PHYSICAL) is None


def test_no_driver_means_no_gpu(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gpus.physical_gpus() == []
