"""Checkpoints of a training run (MATLAB's ``CheckpointPath``), written with orbax.

A checkpoint holds everything needed to continue a run exactly: the state in tree form
(parameters, batch-norm statistics, solver state, iteration, the data-order and
augmentation key; independent of the device count and of the update's parameter layout),
the best-validation network so far when the run may return it (``"best"`` beside the
state), the ``History`` so far (from which validation patience is rebuilt), and the
options and data it was trained with. The iteration
determines the position in the seeded plan, so nothing else is needed.

orbax writes each checkpoint into a temporary folder and renames it when complete, so a
process killed while saving leaves the previous checkpoints usable; saving is
asynchronous (the host copies the arrays, then a background thread writes); only the
newest ``keep`` checkpoints are kept. With several processes every process takes part
in each save and restore, as orbax requires.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import numpy as np

from jaxflowers.options.training import TrainingOptions, recipe_fields
from jaxflowers.training.history import History

FORMAT = 2  # 2: the best-validation network and the new options in the record
class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or does not fit the run that would continue it."""


@dataclasses.dataclass
class Restored:
    """A checkpoint read back: its tree-form state (host arrays) and record."""

    state: Any
    iteration: int
    history: History
    path: pathlib.Path


class Checkpointer:
    """Saves a run's checkpoints into ``path`` (one folder per iteration).

    Args:
      path: the run's checkpoint folder (created if missing).
      keep: newest checkpoints kept; older ones are deleted after each save.
    """

    def __init__(self, path: str | os.PathLike, keep: int):
        import orbax.checkpoint as ocp

        self.path = pathlib.Path(path).expanduser().absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=True)
        try:
            self._manager = ocp.CheckpointManager(self.path, options=options,
                                                  item_names=("state", "record"))
        except OSError as error:
            raise CheckpointError(f"checkpoint_path={str(path)!r} cannot be used: {error}"
                                  ) from error

    def save(self, iteration: int, tree_state, record: dict) -> pathlib.Path:
        """Start writing the checkpoint of ``iteration``; returns its folder. Returns once
        the arrays are copied to the host; the files are written in the background."""
        import orbax.checkpoint as ocp

        self._manager.save(iteration, args=ocp.args.Composite(
            state=ocp.args.StandardSave(tree_state), record=ocp.args.JsonSave(record)))
        return self.path / str(iteration)

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def record(iteration: int, history: History, options: TrainingOptions, data) -> dict:
    """The JSON part of a checkpoint: where the run is and what it was trained with."""
    return {"format": FORMAT, "iteration": int(iteration), "history": history.to_json(),
            "recipe": _recipe(options), "data": _data_record(data)}


def restore(path: str | os.PathLike, tree_shapes, options: TrainingOptions, data) -> Restored:
    """Read the checkpoint at ``path`` for a run with ``options`` on ``data``.

    Args:
      path: a run's checkpoint folder (its newest checkpoint is read) or one checkpoint's
        folder inside it.
      tree_shapes: the shapes and dtypes of the tree-form state this run expects.
      options, data: the continuing run's; they must fit the checkpoint's.

    Raises:
      CheckpointError: no checkpoint there, an unreadable one, or one of another recipe,
        data set or network (the message names the path and what differs).
    """
    import orbax.checkpoint as ocp

    folder, step = _locate(pathlib.Path(path).expanduser().absolute())
    manager = ocp.CheckpointManager(folder, item_names=("state", "record"),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    try:
        meta = manager.restore(step, args=ocp.args.Composite(record=ocp.args.JsonRestore()))
        saved = meta.record
        _check_fits(saved, options, data, folder / str(step))
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_on_one_local_device(tree_shapes))))
    except CheckpointError:
        raise
    except Exception as error:  # orbax raises many types for a corrupt or foreign folder
        raise CheckpointError(f"cannot read the checkpoint {folder / str(step)}: "
                              f"{type(error).__name__}: {error}") from error
    finally:
        manager.close()
    state = _to_host(restored.state)
    return Restored(state, int(saved["iteration"]), History.from_json(saved["history"]),
                    folder / str(step))


def _locate(path: pathlib.Path) -> tuple[pathlib.Path, int]:
    """(the run's folder, the iteration) of a run folder (newest) or a checkpoint folder."""
    if path.name.isdigit() and (path / "record").exists():
        return path.parent, int(path.name)
    steps = sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()
                   and (p / "record").exists()) if path.is_dir() else []
    if not steps:
        raise CheckpointError(f"no checkpoint in {path} (resume= takes a checkpoint_path "
                              "folder or one of its numbered checkpoint folders)")
    return path, steps[-1]


def _check_fits(saved: dict, options: TrainingOptions, data, where: pathlib.Path) -> None:
    if saved.get("format") != FORMAT:
        raise CheckpointError(f"{where} has checkpoint format {saved.get('format')!r}; this "
                              f"version reads format {FORMAT}")
    # Fields newer than a checkpoint hold their default there.
    now, then = _recipe(options), {"learn_rate_factors": [], **saved["recipe"]}
    differ = [f"{k} ({then.get(k)!r} there, {now[k]!r} now)" for k in now
              if then.get(k) != now[k]]
    if differ:
        raise CheckpointError(f"{where} was trained with other options: {', '.join(differ)}")
    data_now, data_then = _data_record(data), saved["data"]
    if data_now != data_then:
        raise CheckpointError(f"{where} was trained on other data: {data_then} there, "
                              f"{data_now} now")
    steps_per_epoch = saved["history"]["steps_per_epoch"]
    if saved["iteration"] > options.max_epochs * steps_per_epoch:
        raise CheckpointError(f"{where} is at iteration {saved['iteration']}, beyond "
                              f"max_epochs={options.max_epochs} ({steps_per_epoch} per epoch)")


def _recipe(options: TrainingOptions) -> dict:
    from jaxflowers.schedules import spans_training

    values = {name: getattr(options, name) for name in recipe_fields()}
    values["initial_learn_rate"] = options.learn_rate
    values["squared_gradient_decay_factor"] = options.squared_decay
    values["augmentation"] = repr(values["augmentation"])
    values["metrics"] = list(options.metrics)
    values["learn_rate_factors"] = [list(pair) for pair in options.learn_rate_factors]
    schedule = options.learn_rate_schedule
    values["learn_rate_schedule"] = schedule if isinstance(schedule, str) else repr(schedule)
    values["schedule_epochs"] = (options.max_epochs if spans_training(schedule) else None)
    values["output_network"] = ("best-validation" if options.best_validation
                                else "last-iteration")
    return values


def _data_record(data) -> dict:
    from jaxflowers.data.feed import image_shape

    return {"images": len(data), "image_shape": list(image_shape(data)),
            "class_names": [str(c) for c in data.class_names]}


def _on_one_local_device(tree_shapes):
    """The shapes, each placed whole on one device of this process: a checkpoint written on
    other devices (another count, other processes) is read back into every process's own
    memory, whatever topology wrote it."""
    import jax

    try:
        device = jax.local_devices(backend="cpu")[0]  # host memory: the state goes there next
    except RuntimeError:  # no CPU backend (JAX_PLATFORMS without "cpu")
        device = jax.local_devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                        tree_shapes)


def _to_host(tree):
    import jax

    return jax.tree.map(np.asarray, tree)
