"""GPUMonitor: device selection, sampling and summaries against a fake NVML; no-GPU path."""
import os
import sys
import time
import types

import numpy as np
import pytest

from jaxflowers.host import gpus
from jaxflowers.monitor import GPUMonitor

UUIDS = ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-cccc3333", "GPU-dddd4444"]


class FakeNVMLError(Exception):
    pass


def fake_nvml(num_gpus=4, util=None, power_supported=True):
    """A pynvml stand-in. util[i] is the list of utilisations GPU i reports, one per call
    (the last value repeats); memory used is 1000 MiB * (i + 1) + 10 MiB per call."""
    util = util or {}
    calls = {i: 0 for i in range(num_gpus)}
    nv = types.ModuleType("pynvml")
    nv.NVMLError = FakeNVMLError
    nv.NVML_TEMPERATURE_GPU = 0
    nv.inits = nv.shutdowns = 0

    def init():
        nv.inits += 1

    def shutdown():
        nv.shutdowns += 1

    def utilization(h):
        seq = util.get(h, [50.0])
        value = seq[min(calls[h], len(seq) - 1)]
        calls[h] += 1
        return types.SimpleNamespace(gpu=value, memory=0)

    def memory(h):
        used = (1000 * (h + 1) + 10 * (calls[h] - 1)) * 2**20
        return types.SimpleNamespace(used=used, total=80 * 1024 * 2**20, free=0)

    def power(h):
        if not power_supported:
            raise FakeNVMLError("Not Supported")
        return 100_000 + 1000 * h  # mW

    nv.nvmlInit, nv.nvmlShutdown = init, shutdown
    nv.nvmlDeviceGetCount = lambda: num_gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: UUIDS[h]
    nv.nvmlDeviceGetName = lambda h: b"Fake H200"  # old pynvml returns bytes
    nv.nvmlDeviceGetUtilizationRates = utilization
    nv.nvmlDeviceGetMemoryInfo = memory
    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 40 + h
    return nv


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpus, "has_nvidia_driver", lambda: True)

    def install(**kwargs):
        nv = fake_nvml(**kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", nv)
        return nv
    return install


def test_without_pynvml_records_nothing_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "has_nvidia_driver", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    assert GPUMonitor.available() is False
    with GPUMonitor(interval=0.01) as mon:
        time.sleep(0.05)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nvidia-ml-py" in err[0] and "recording nothing" in err[0]
    assert not mon.running and mon.latest() == {}
    hist = mon.history()
    assert hist["time"].shape == (0,) and hist["utilization"].shape == (0, 0)
    assert "no samples" in mon.summary()


def test_nvml_without_gpus_records_nothing(nvml, capsys):
    nv = nvml(num_gpus=0)
    assert GPUMonitor.available() is False
    mon = GPUMonitor().start()
    mon.stop()
    assert "no visible GPU" in capsys.readouterr().err
    assert mon.history()["utilization"].shape == (0, 0)
    assert nv.inits == nv.shutdowns == 2


def test_without_a_driver_it_says_so_without_advice_to_install_anything(monkeypatch, capsys):
    monkeypatch.setattr(gpus, "has_nvidia_driver", lambda: False)
    assert GPUMonitor.available() is False
    GPUMonitor().start().stop()
    assert capsys.readouterr().err == ("GPUMonitor: no NVIDIA GPU driver on this machine; "
                                       "recording nothing.\n")


def test_the_real_nvml_agrees_with_the_gpu_listing():
    """On this machine, whatever it has: available() is True exactly when the one GPU
    listing (NVML or nvidia-smi) finds a visible GPU."""
    pytest.importorskip("pynvml")
    visible = gpus.cuda_order(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus.physical_gpus())
    assert GPUMonitor.available() is bool(visible)


@pytest.mark.parametrize("env, devices, expected", [
    (None, None, [0, 1, 2, 3]),
    ("2,GPU-dddd", None, [2, 3]),       # UUID prefixes, as CUDA accepts them
    ("2,GPU-dddd", [1], [3]),           # devices= are visible ordinals
    ("1,7,2", None, [1]),               # CUDA stops at the first invalid entry
    ("", None, []),
    ("", [0], []),                      # no visible GPU: nothing recorded, no error
    (None, ["GPU-bbbb2222", 0], [1, 0]),
    ("3", 0, [3]),
])
def test_devices_follow_cuda_visible_devices(nvml, monkeypatch, env, devices, expected):
    nvml()
    if env is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    with GPUMonitor(interval=60, devices=devices) as mon:
        pass
    assert mon.devices == expected
    assert mon.history()["device"].tolist() == expected


def test_unknown_device_is_a_clear_error(nvml, monkeypatch):
    nv = nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ValueError, match="not one of the 2 visible GPUs"):
        GPUMonitor(devices=[2]).start()
    assert nv.inits == nv.shutdowns


def test_history_has_exact_values_in_order(nvml):
    nv = nvml(num_gpus=2, util={0: [10.0, 20.0, 30.0, 40.0, 50.0], 1: [5.0]})
    with GPUMonitor(interval=0.005) as mon:
        while len(mon.history()["time"]) < 5:
            time.sleep(0.005)
    hist = mon.history()
    t = len(hist["time"])
    assert t >= 6  # start, >= 4 periodic, and one on stop
    expected0 = [10.0, 20.0, 30.0, 40.0] + [50.0] * (t - 4)
    np.testing.assert_array_equal(hist["utilization"], np.array([expected0, [5.0] * t]).T)
    np.testing.assert_array_equal(hist["memory_used"][:, 1], 2000 + 10 * np.arange(t))
    np.testing.assert_array_equal(hist["memory_total"], np.full((t, 2), 81920.0))
    np.testing.assert_array_equal(hist["power"][-1], [100.0, 101.0])
    np.testing.assert_array_equal(hist["temperature"][0], [40.0, 41.0])
    assert np.all(np.diff(hist["time"]) >= 0) and hist["time"][0] >= 0
    assert mon.names == ["Fake H200", "Fake H200"]
    latest = mon.latest()
    np.testing.assert_array_equal(latest["utilization"], [50.0, 5.0])
    assert latest["timestamp"] == hist["timestamp"][-1]
    assert nv.inits == nv.shutdowns == 1


def test_summary_table_is_exact(nvml):
    # A long interval gives exactly two samples: one at start, one at stop.
    nvml(num_gpus=2, util={0: [30.0, 90.0], 1: [0.0, 10.0]}, power_supported=False)
    with GPUMonitor(interval=3600) as mon:
        pass
    hist = mon.history()
    assert hist["utilization"].tolist() == [[30.0, 0.0], [90.0, 10.0]]
    assert np.isnan(hist["power"]).all()  # unsupported reading: NaN, not a crash
    lines = mon.summary().splitlines()
    assert lines[0].startswith("GPU monitor: 2 samples")
    assert lines[2].split() == ["0", "Fake", "H200", "60.0", "%", "90.0", "%", "1010", "/",
                                "81920"]
    assert lines[3].split() == ["1", "Fake", "H200", "5.0", "%", "10.0", "%", "2010", "/",
                                "81920"]


@pytest.mark.parametrize("use_context", [True, False])
def test_thread_stops_promptly(nvml, use_context):
    nvml()
    mon = GPUMonitor(interval=30.0)
    if use_context:
        with mon:
            thread = mon._thread
            time.sleep(0.05)
            start = time.perf_counter()
    else:
        mon.start()
        thread = mon._thread
        time.sleep(0.05)
        start = time.perf_counter()
        mon.stop()
    assert time.perf_counter() - start < 5.0  # not waiting out the 30 s interval
    assert thread.daemon and not thread.is_alive() and not mon.running
    assert len(mon.history()["time"]) == 2


def test_restart_appends_and_rejects_bad_interval(nvml):
    nvml(num_gpus=1)
    mon = GPUMonitor(interval=3600)
    mon.start().stop()
    mon.start().stop()
    assert len(mon.history()["time"]) == 4
    with pytest.raises(ValueError, match="positive"):
        GPUMonitor(interval=0)
