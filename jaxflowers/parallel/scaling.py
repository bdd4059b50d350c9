"""The MATLAB multi-GPU example's scaling of batch and learning rate to the devices in use."""
from __future__ import annotations

from jaxflowers.options.training import TrainingOptions
from jaxflowers.parallel.data_parallel import select_devices

__all__ = ["scale_for_devices"]


def scale_for_devices(options: TrainingOptions, num_devices: int | None = None, *,
                      verbose: bool | None = None) -> TrainingOptions:
    """Batch x N, learning rate x N (Goyal et al. 2017), as the MATLAB multi-GPU example.

    Args:
      options: options whose ``mini_batch_size`` is the per-device batch.
      num_devices: N; None counts every device ``options.execution_environment`` selects.
      verbose: print what changed (default: ``options.verbose``).

    Returns:
      New ``TrainingOptions`` with the global batch and the scaled learning rate.
    """
    if num_devices is None:
        num_devices = len(select_devices(options.execution_environment))
    scaled = options.scaled(num_devices)
    if options.verbose if verbose is None else verbose:
        devices = f"{num_devices} device{'s' if num_devices > 1 else ''}"
        print(f"scale_for_devices: {devices}: mini_batch_size "
              f"{options.mini_batch_size} -> {scaled.mini_batch_size}, initial_learn_rate "
              f"{options.learn_rate:g} -> {scaled.learn_rate:g}")
    return scaled
