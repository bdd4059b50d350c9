"""GPU monitor: MATLAB's GPU Monitor as a sampling thread over NVML.

``pynvml`` loads only when a monitor starts; without NVML or GPUs a monitor prints one line,
records nothing and never raises. ``devices`` are CUDA's ordinals, mapped to NVML's.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from jaxflowers.host import gpus

__all__ = ["GPUMonitor"]

_MIB = float(2**20)

# One reader per recorded quantity; a reader the GPU does not support gives NaN.
_READERS = {
    "utilization": lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu,  # percent
    "memory_used": lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).used / _MIB,  # MiB
    "memory_total": lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).total / _MIB,  # MiB
    "power": lambda nv, h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW -> W
    "temperature": lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
}


def _open_nvml():
    """(pynvml module, None) with NVML initialised, or (None, reason) where it can't be."""
    if not gpus.has_nvidia_driver():
        return None, "no NVIDIA GPU driver on this machine"
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML could not start ({err})"
    return pynvml, None


def _visible_indices(physical: list[tuple[str, str]]) -> list[int]:
    """NVML indices of the GPUs CUDA shows, in CUDA's order, from ``CUDA_VISIBLE_DEVICES``."""
    # why integers are NVML indices: CUDA agrees with CUDA_DEVICE_ORDER=PCI_BUS_ID or one model.
    return [i for _, i in gpus.cuda_order(os.environ.get("CUDA_VISIBLE_DEVICES"), physical)]


def _select(nv, devices) -> list[int]:
    """NVML indices for ``devices`` (visible ordinals or UUIDs; None = all visible)."""
    physical = gpus.physical_gpus(nv)
    visible = _visible_indices(physical)
    if devices is None or not visible:  # no GPU at all: record nothing, don't raise
        return visible
    chosen = []
    for dev in [devices] if isinstance(devices, (int, np.integer, str)) else devices:
        index = (gpus.uuid_position(dev, physical) if isinstance(dev, str)
                 else visible[dev] if 0 <= dev < len(visible) else None)
        if index is None:
            raise ValueError(f"GPUMonitor(devices={devices!r}): {dev!r} is not one of the "
                             f"{len(visible)} visible GPUs (ordinals 0..{len(visible) - 1}) "
                             "nor a GPU UUID")
        chosen.append(index)
    return chosen


def _quiet(fn, values: np.ndarray) -> np.ndarray:
    """``fn`` (nanmean/nanmax) over axis 0, NaN for all-NaN columns instead of a warning."""
    out = np.full(values.shape[1:], np.nan)
    ok = ~np.all(np.isnan(values), axis=0)
    out[ok] = fn(values[:, ok], axis=0)
    return out


class GPUMonitor:
    """Record GPU use, memory, power, temperature in a thread (MATLAB: the GPU Monitor).

    A context manager, or ``start()``/``stop()``; samples at start, every ``interval`` s, at stop.

    Args:
      interval: seconds between samples (> 0).
      devices: None (all visible), visible ordinals (int or list), or GPU UUID (prefix) strings.
    """

    def __init__(self, interval: float = 1.0, devices=None):
        if not interval > 0:
            raise ValueError(f"GPUMonitor(interval={interval!r}) must be a positive number "
                             "of seconds")
        self.interval = float(interval)
        self._requested = devices
        self.devices: list[int] = []  # NVML (nvidia-smi) indices of the watched GPUs, by start()
        self.names: list[str] = []  # their product names
        self.reason: str | None = None  # why nothing is recorded, or None
        self._nv = None
        self._handles: list = []
        self._rows: list[tuple[float, dict]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0: float | None = None

    @staticmethod
    def available() -> bool:
        """True when NVML loads and shows at least one visible GPU; never raises."""
        nv, _ = _open_nvml()
        if nv is None:
            return False
        try:
            return len(_visible_indices(gpus.physical_gpus(nv))) > 0
        except Exception:
            return False
        finally:
            nv.nvmlShutdown()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "GPUMonitor":
        """Start sampling (a no-op while running); returns self."""
        if self.running:
            return self
        nv, self.reason = _open_nvml()
        if nv is not None:
            try:
                self.devices = _select(nv, self._requested)
            except BaseException:
                nv.nvmlShutdown()
                raise
            self.reason = None if self.devices else "no visible GPU"
        if self.reason is not None:
            if nv is not None:
                nv.nvmlShutdown()
            print(f"GPUMonitor: {self.reason}; recording nothing.", file=sys.stderr)
            return self
        self._nv = nv
        self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in self.devices]
        self.names = [gpus.text(nv.nvmlDeviceGetName(h)) for h in self._handles]
        self._t0 = self._t0 or time.time()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="GPUMonitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling after one last sample; returns once the thread has ended."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()  # wakes the thread at once, whatever the interval
        thread.join(timeout=5.0)
        if not thread.is_alive():  # never shut NVML down under a thread still calling it
            self._nv.nvmlShutdown()
        self._nv = None

    def __enter__(self) -> "GPUMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        self._record()
        while not self._stop.wait(self.interval):
            self._record()
        self._record()

    def _record(self) -> None:
        nv = self._nv
        row = {key: np.full(len(self._handles), np.nan) for key in _READERS}
        for g, handle in enumerate(self._handles):
            for key, read in _READERS.items():
                try:
                    row[key][g] = read(nv, handle)
                except nv.NVMLError:  # e.g. power or utilisation not supported (MIG)
                    pass
        with self._lock:
            self._rows.append((time.time(), row))

    def history(self) -> dict[str, np.ndarray]:
        """Everything recorded so far, as numpy arrays (T samples, G GPUs).

        Returns:
          ``timestamp``, ``time`` (since start) (T,) float64 s; ``device`` (G,) int64; (T, G)
          float64 ``utilization`` (%), ``memory_used``/``memory_total`` (MiB), ``power`` (W),
          ``temperature`` (deg C); NaN where a GPU reports nothing.
        """
        with self._lock:
            rows = list(self._rows)
        g = len(self.devices)
        stamps = np.array([t for t, _ in rows], dtype=np.float64)
        out = {"timestamp": stamps, "time": stamps - (self._t0 or 0.0),
               "device": np.array(self.devices, dtype=np.int64)}
        for key in _READERS:
            out[key] = np.array([r[key] for _, r in rows], dtype=np.float64).reshape(len(rows), g)
        return out

    def latest(self) -> dict:
        """The newest sample: ``timestamp`` (float) and (G,) float64 arrays; {} if none."""
        with self._lock:
            if not self._rows:
                return {}
            stamp, row = self._rows[-1]
        return {"timestamp": stamp, **{key: value.copy() for key, value in row.items()}}

    def summary(self) -> str:
        """Mean and peak utilisation and peak memory per GPU, as a small text table."""
        hist = self.history()
        if hist["time"].size == 0:
            return f"GPUMonitor: no samples ({self.reason or 'not started'})"
        util, mem = hist["utilization"], hist["memory_used"]
        mean, peak = _quiet(np.nanmean, util), _quiet(np.nanmax, util)
        mem_peak, total = _quiet(np.nanmax, mem), _quiet(np.nanmax, hist["memory_total"])
        lines = [f"GPU monitor: {hist['time'].size} samples over {hist['time'][-1]:.1f} s",
                 f"{'GPU':>3}  {'name':<22}{'util mean':>10}{'util peak':>10}"
                 f"{'mem peak / total (MiB)':>26}"]
        for g, index in enumerate(self.devices):
            lines.append(f"{index:>3}  {self.names[g][:21]:<22}{mean[g]:>8.1f} %"
                         f"{peak[g]:>8.1f} %{mem_peak[g]:>15.0f} / {total[g]:.0f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (f"GPUMonitor(interval={self.interval}, devices={self.devices}, {state}, "
                f"{len(self._rows)} samples)")
