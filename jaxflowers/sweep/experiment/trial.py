"""The jobs of an experiment, run inside a sweep worker: one trial (train, save, sum up)
and the test of the best network.

A trial's worker keeps its network and metrics in the trial's folder and returns only
numbers and paths, so the experiment's caller never rebuilds a network (nor imports JAX).
JAX is imported inside the functions.
"""
from __future__ import annotations

import math
import os
import pathlib
import socket

from jaxflowers import recipes

__all__ = ["summary", "test_job", "trial_job", "trial_options"]

NETWORK, METRICS = "net.safetensors", "metrics.csv"  # in each trial's folder


def trial_job(*, recipe: str, data: dict, model, options: dict, execution: dict,
              folder: str) -> dict:
    """Train one trial of an experiment and keep its network and metrics in ``folder``.

    Args:
      recipe: the ``recipes.RECIPES`` name whose options the trial starts from.
      data: the trial's data plan (training, validation and test sets).
      model: the network's spec, e.g. ``("cifar_net", {"depth": 2})``.
      options: ``TrainingOptions`` fields replacing the recipe's.
      execution: ``ExecutionOptions`` fields (``num_devices``: the devices it trains on).
      folder: where ``net.safetensors`` and ``metrics.csv`` go (created).

    Returns:
      ``summary(info)`` plus "network" and "metrics" (paths; "network" is None for a run
      that diverged), "host" and "devices" (this worker's ``CUDA_VISIBLE_DEVICES``, or
      "cpu"). Every ``train`` progress message reaches the pool (``train_job``).
    """
    from jaxflowers.sweep.jobs import train_job

    train_set, validation_set, _ = recipes.load_plan(data)
    devices = int(execution.get("num_devices") or 1)
    training = trial_options(recipe, devices, len(train_set), options, validation_set)
    net, info = train_job(data={"train": train_set, "validation": validation_set},
                          model=model, options=training, execution=execution)
    out = pathlib.Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    network = None if info.diverged else str(net.save(out / NETWORK))
    metrics = info.to_csv(out / METRICS)
    return {**summary(info), "network": network, "metrics": metrics,
            "host": socket.gethostname(),
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES") or "cpu"}


def trial_options(recipe: str, num_devices: int, num_train: int, options: dict,
                  validation_data):
    """The ``TrainingOptions`` of a trial: the recipe's for its devices, training set and
    validation set, with ``options`` (plain values: an augmentation or schedule as a dict)
    replacing them. Imports no JAX."""
    from jaxflowers.options import TrainingOptions

    options = {**options, "validation_data": validation_data}
    given = TrainingOptions.from_dict(options)  # dicts become their objects, checked
    fields = {name: getattr(given, name) for name in options}
    return recipes.recipe(recipe).options(num_devices, num_train, **fields)


def summary(info) -> dict:
    """A ``TrainingInfo`` in numbers: final and best validation values, how it stopped,
    how long it took (JSON-able; None where there was no validation)."""
    accuracy, loss = list(info.validation_accuracy), list(info.validation_loss)
    finals = {f"final_validation_{name}": _number(value)
              for name, value in info.final_validation_metrics.items()}
    return {**finals,
            "final_validation_accuracy": _number(info.final_validation_accuracy),
            "final_validation_loss": _number(info.final_validation_loss),
            "best_validation_accuracy": _number(max(accuracy, default=None)),
            "best_validation_loss": _number(min(loss, default=None)),
            "iterations": int(len(info.iteration)),
            "epochs": int(info.epoch[-1]) if len(info.epoch) else 0,
            "stop_reason": info.stop_reason, "diverged": bool(info.diverged),
            "compile_time": float(info.compile_time), "train_time": float(info.train_time),
            "num_devices": int(info.num_devices)}


def test_job(*, network: str, data: dict):
    """The classes a saved network predicts for a plan's test set.

    Args:
      network: a file ``TrainedNet.save`` wrote.
      data: the plan whose test set is predicted.

    Returns:
      ``(codes, class_names)``: int32 (N,) class indices into the network's class names,
      one per test image in the plan's order.
    """
    import numpy as np

    from jaxflowers.inference.net import load
    from jaxflowers.inference.predict import predict

    net = load(network)
    test_set = recipes.load_plan(data)[2]
    codes = np.argmax(predict(net, test_set), axis=1).astype(np.int32)
    print(f"Predicted the {len(test_set)} test images", flush=True)
    return codes, list(net.class_names)


def _number(value) -> float | None:
    """A float, or None for None and values that are not finite (JSON has no NaN)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
