"""Reading a checkpoint back to continue a run (``train(..., resume=path)``).

A record that does not fit the run is an error naming both sides; a checkpoint whose arrays fail
their digests is skipped for the one before."""
from __future__ import annotations

import dataclasses
import pathlib
import warnings
from typing import Any

import numpy as np

from jaxflowers.data import digests
from jaxflowers.options.training import TrainingOptions
from jaxflowers.training import checkpoint as ck
from jaxflowers.training.checkpoint import CheckpointError
from jaxflowers.training.history import History

__all__ = ["Restored", "restore"]


@dataclasses.dataclass
class Restored:
    """A checkpoint read back: its tree-form state (host arrays) and record."""

    state: Any
    iteration: int
    history: History
    path: pathlib.Path


def restore(path, tree_shapes, options: TrainingOptions, data, *, model=None,
            data_digest: str | None = None) -> Restored:
    """Read the checkpoint at ``path`` for a run with ``options`` on ``data``.

    Args:
      path: a run's checkpoint folder (its newest sound checkpoint) or one ``iteration_<N>``.
      tree_shapes: the shapes and dtypes of the tree-form state this run expects.
      options, data, model, data_digest: the continuing run's; they must fit the checkpoint's.

    Raises:
      CheckpointError: no sound checkpoint, or one of another recipe, network or data set.
    """
    ck.quiet_orbax()  # e.g. its note that a folder opened read-only is read-only
    folder, steps, named = _locate(pathlib.Path(path).expanduser().absolute())
    for position, step in enumerate(reversed(steps)):
        where = folder / f"{ck.PREFIX}_{step}"
        try:
            return _restore_one(folder, step, where, tree_shapes, options, data, model,
                                data_digest)
        except _Damaged as damage:
            if named or position == len(steps) - 1:
                raise CheckpointError(str(damage)) from None
            warnings.warn(f"{damage}; resuming from the checkpoint before it instead",
                          RuntimeWarning, stacklevel=2)
    raise AssertionError("unreachable")


class _Damaged(Exception):
    """A checkpoint whose files cannot be read or do not match their digests."""


def _restore_one(folder, step, where, tree_shapes, options, data, model, data_digest):
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(folder, item_names=ck.ITEMS, options=ocp.
                                    CheckpointManagerOptions(read_only=True, step_prefix=ck.PREFIX))
    try:
        try:
            saved = manager.restore(step, args=ocp.args.Composite(
                record=ocp.args.JsonRestore())).record
        except Exception as error:  # noqa: BLE001 (orbax raises many types for damage)
            raise _Damaged(f"cannot read the checkpoint {where}: {type(error).__name__}: "
                           f"{error}") from None
        _check_fits(saved, options, data, model, data_digest, where)
        try:
            restored = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_on_one_local_device(tree_shapes))))
        except Exception as error:  # noqa: BLE001
            raise _Damaged(f"cannot read the checkpoint {where}: {type(error).__name__}: "
                           f"{error}") from None
    finally:
        manager.close()
    state = _to_host(restored.state)
    _check_digests(state, saved.get("digests", {}), where)
    return Restored(state, int(saved["iteration"]), History.from_json(saved["history"]), where)


def _locate(path: pathlib.Path) -> tuple[pathlib.Path, list[int], bool]:
    """(the run's folder, its checkpoints' iterations, whether one was named)."""
    name, _, number = path.name.partition("_")
    if name == ck.PREFIX and number.isdigit() and (path / "record").exists():
        return path.parent, [int(number)], True
    steps = ck.checkpoint_steps(path)
    if not steps:
        old = sorted(p.name for p in path.iterdir() if p.name.isdigit()) if path.is_dir() else []
        hint = (f"; it holds folders {', '.join(old[:3])}: checkpoints of jaxflowers 0.1, "
                "which that version resumes" if old else "")
        raise CheckpointError(f"no checkpoint in {path} (resume= takes a checkpoint_path "
                              f"folder or one of its {ck.PREFIX}_<N> folders){hint}")
    return path, steps, False


def _check_fits(saved: dict, options, data, model, data_digest, where) -> None:
    if saved.get("format") not in ck.READS:
        raise CheckpointError(f"{where} has checkpoint format {saved.get('format')!r}; this "
                              f"version reads formats {', '.join(map(str, ck.READS))}")
    # Fields newer than a checkpoint hold their default there.
    now, then = ck.recipe(options), {"learn_rate_factors": [], **saved["recipe"]}
    differ = [f"{k} ({then.get(k)!r} there, {now[k]!r} now)" for k in now if then.get(k) != now[k]]
    if differ:
        raise CheckpointError(f"{where} was trained with other options: {', '.join(differ)}")
    built = ck.model_record(model)
    if model is not None and saved.get("model") not in (None, built):
        raise CheckpointError(f"{where} holds {saved['model']}; this run builds {built}")
    data_now, data_then = ck.data_record(data, data_digest), saved["data"]
    shape_now = {k: v for k, v in data_now.items() if k != "digest"}
    if shape_now != {k: v for k, v in data_then.items() if k != "digest"}:
        raise CheckpointError(f"{where} was trained on other data: {data_then} there, "
                              f"{data_now} now")
    if data_digest is not None and data_then.get("digest") and saved["format"] == 3:
        data_digest = digests.bytes_digest(data)  # format 3 digested the images' bytes
    if None not in (data_digest, data_then.get("digest")) and data_then["digest"] != data_digest:
        raise CheckpointError(f"{where} was trained on other images: the training set has as "
                              "many images of the same classes, but their contents changed")
    steps_per_epoch = saved["history"]["steps_per_epoch"]
    if saved["iteration"] > options.max_epochs * steps_per_epoch:
        raise CheckpointError(f"{where} is at iteration {saved['iteration']}, beyond "
                              f"max_epochs={options.max_epochs} ({steps_per_epoch} per epoch)")


def _check_digests(state, digests: dict, where) -> None:
    found = ck.hex_digests(ck.tree_digests(state))
    bad = [path for path, value in digests.items() if found.get(path) != value]
    if bad or (digests and set(found) != set(digests)):
        first = bad[0] if bad else sorted(set(found) ^ set(digests))[0]
        raise _Damaged(f"the checkpoint {where} is damaged: its array {first} does not match "
                       "the digest written with it")


def _on_one_local_device(tree_shapes):
    """The shapes, each whole on one local device, so any topology's checkpoint reads back."""
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
