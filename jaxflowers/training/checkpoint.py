"""Writing a run's checkpoints (MATLAB's ``CheckpointPath``) with orbax.

A checkpoint is the state in tree form (it resumes on any device count and layout), the best
network so far and a JSON record with digests. One run owns its folder (a lock naming the
holder); each ``iteration_<N>`` folder is renamed into place when complete.
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pathlib
import shutil
import socket
import sys
import threading
import warnings

import numpy as np

from jaxflowers.data.feed import image_shape
from jaxflowers.options.training import TrainingOptions, recipe_fields
from jaxflowers.training.history import History

__all__ = ["CheckpointError", "CheckpointSaveError", "Checkpointer", "FORMAT", "ITEMS", "LOCK",
           "PREFIX", "READS", "checkpoint_steps", "data_record", "hex_digests", "model_record",
           "quiet_orbax", "recipe", "record", "tree_digests"]

FORMAT = 4  # 3: iteration_<N> folders, the network's spec, digests of the state and data;
# 4: the data's digest made of per-image digests (``data.digests.set_digest``)
READS = (3, 4)  # the formats this version resumes (3: the data's digest is of its bytes)
PREFIX = "iteration"  # orbax's step prefix: checkpoints are iteration_<N>
LOCK = ".jaxflowers-lock"
_TMP = ".orbax-checkpoint-tmp"
ITEMS = ("state", "record")
# Odd constants of the digest: element i of a leaf contributes (bits ^ i * _SPREAD) * _MIX.
_SPREAD, _MIX = np.uint32(0x9E3779B9), np.uint32(0x85EBCA6B)


class CheckpointError(ValueError):
    """A checkpoint folder or checkpoint that cannot be used by the run that would continue it."""


class CheckpointSaveError(OSError):
    """A save failed and the run was asked to stop on that (``checkpoint_failure="stop"``)."""


class Checkpointer:
    """Saves one run's checkpoints into ``path``, each in a background thread of its own.

    Args:
      keep, on_failure: newest checkpoints kept; "warn" (and go on) or "stop" on a failed save.
      resuming: continue the checkpoints already there (else they are refused).
      owner, background: whether this process holds the lock; whether to write in a thread
        (not with several processes: orbax's barriers must not interleave with collectives).

    Raises:
      CheckpointError: the folder cannot be used, is locked, or holds another run's checkpoints.
    """

    def __init__(self, path, keep: int, *, on_failure: str = "warn", resuming: bool = False,
                 owner: bool = True, background: bool = True):
        import orbax.checkpoint as ocp

        self.path = pathlib.Path(path).expanduser().absolute()
        self.on_failure, self.written, self.background = on_failure, [], background
        self._writer: threading.Thread | None = None
        self._outcome: tuple = ()
        self._failures: dict[str, int] = {}  # cause -> saves that failed of it
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CheckpointError(f"checkpoint_path={str(path)!r} cannot be used: "
                                  f"{error.strerror or error}") from None
        self._lock = _take_lock(self.path) if owner else None
        try:
            if not resuming:
                _refuse_foreign(self.path)
            quiet_orbax()
            # why synchronous (in our own thread): orbax's async mode leaves threads hanging
            # after a failed write; here a failure is an exception caught by _write
            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, enable_async_checkpointing=False,
                step_prefix=PREFIX, cleanup_tmp_directories=True)
            self._manager = ocp.CheckpointManager(self.path, options=options, item_names=ITEMS)
        except BaseException:
            self._unlock()
            raise

    def save(self, iteration: int, tree_state, record: dict) -> bool:
        """Start writing the checkpoint of ``iteration`` after the previous one; whether started.

        Raises ``CheckpointSaveError`` when a save failed and ``on_failure="stop"``."""
        self._settle()
        short = _space_short(self.path, tree_state)
        if short:  # refused before writing: a write that runs out of space is noisier
            return self._failed(iteration, short)
        self._writer = threading.Thread(target=self._write, args=(iteration, tree_state, record),
                                        name="jaxflowers-checkpoint", daemon=True)
        if not self.background:
            self._writer.run()  # here, in this thread
            self._settle()
            return bool(self.written) and self.written[-1] == iteration
        self._writer.start()
        return True

    def finish(self) -> pathlib.Path | None:
        """Wait for the last save, release the folder; the newest complete checkpoint, or None."""
        try:
            self._settle()
        finally:
            with contextlib.suppress(Exception):
                self._manager.close()
            self._unlock()
        for cause, count in self._failures.items():
            if count > 1:
                warnings.warn(f"{count} checkpoints in all could not be written into "
                              f"{self.path} ({cause})", RuntimeWarning, stacklevel=2)
        return self.path / f"{PREFIX}_{self.written[-1]}" if self.written else None

    def _write(self, iteration: int, tree_state, record: dict) -> None:
        import jax
        import orbax.checkpoint as ocp

        try:
            if self.background:  # one process: orbax writes numpy leaves faster than arrays
                tree_state = jax.device_get(tree_state)  # one batched copy to the host
            started = self._manager.save(iteration, args=ocp.args.Composite(
                state=ocp.args.StandardSave(tree_state), record=ocp.args.JsonSave(record)))
            self._outcome = (iteration, None if started else
                             "orbax did not write it (a newer checkpoint is in the folder)")
        except Exception as error:  # noqa: BLE001 (orbax raises many types for I/O errors)
            self._outcome = (iteration, error)

    def _settle(self) -> None:
        """Wait for the save in flight, and count it written or failed."""
        if self._writer is None:
            return
        if self._writer.is_alive():
            self._writer.join()
        self._writer = None
        iteration, error = self._outcome
        if error is None:
            self.written.append(iteration)
        else:
            self._failed(iteration, error)

    def _failed(self, iteration: int, error) -> bool:
        for tmp in self.path.glob(f"*{_TMP}*"):  # what the failed save left half-written
            shutil.rmtree(tmp, ignore_errors=True)
        cause = error if isinstance(error, str) else _cause(error)
        what = "training stops" if self.on_failure == "stop" else "training goes on without it"
        message = (f"could not write the checkpoint of iteration {iteration} into "
                   f"{self.path}: {cause}; {what}")
        if self.on_failure == "stop":
            raise CheckpointSaveError(message)
        self._failures[cause] = self._failures.get(cause, 0) + 1
        if self._failures[cause] == 1:  # the next ones of this cause are counted at the end
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return False

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            with contextlib.suppress(OSError):
                (self.path / LOCK).unlink()
            self._lock = None


def checkpoint_steps(folder: pathlib.Path) -> list[int]:
    """The iterations of the complete checkpoints in ``folder``, oldest first."""
    if not folder.is_dir():
        return []
    steps = []
    for entry in folder.iterdir():
        name, _, number = entry.name.partition("_")
        if name == PREFIX and number.isdigit() and (entry / "record").exists():
            steps.append(int(number))
    return sorted(steps)


def _refuse_foreign(path: pathlib.Path) -> None:
    steps = checkpoint_steps(path)
    if steps:
        raise CheckpointError(
            f"checkpoint_path {path} already holds the checkpoints of another run "
            f"(iterations {steps[0]}-{steps[-1]}); continue it with resume={str(path)!r} "
            "(--resume), or give another folder")


def _take_lock(path: pathlib.Path):
    """The flocked lock file of ``path``, or ``CheckpointError`` naming a live holder."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no lock
        return None
    file = path / LOCK
    try:
        file.touch(exist_ok=True)
        lock = open(file, encoding="utf-8")  # read-only: never keeps the disk from going read-only
    except OSError as error:
        raise CheckpointError(f"checkpoint_path {path} cannot be used: "
                              f"{error.strerror or error}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = lock.read().strip() or "another process"
        lock.close()
        raise CheckpointError(f"checkpoint_path {path} is in use by another run ({holder}); "
                              "wait for it to end, or give another folder") from None
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with open(file, "w", encoding="utf-8") as note:  # who holds it, for the next one's message
        note.write(f"pid {os.getpid()} on {socket.gethostname()}, started {started}: "
                   f"{' '.join(sys.argv)[:200]}\n")
    return lock


def _space_short(folder: pathlib.Path, tree) -> str | None:
    """Why ``folder``'s file system cannot take a checkpoint of ``tree`` now, or None."""
    import jax

    needed = int(1.1 * sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree.leaves(tree)))
    try:
        stats = os.statvfs(folder)
    except (OSError, AttributeError):  # no statvfs (Windows): let the write tell
        return None
    free = stats.f_bavail * stats.f_frsize
    if free < needed + (1 << 20):
        return (f"No space left on device ({free / 2**20:.1f} MiB free, the checkpoint "
                f"needs about {needed / 2**20:.1f} MiB)")
    return None


def _cause(error: BaseException) -> str:
    """The first line of an orbax/tensorstore error, down to the OS's words where given."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    for words in ("No space left on device", "Read-only file system", "Permission denied",
                  "Disk quota exceeded"):
        if words in str(error):
            return words
    return text[:200]


def quiet_orbax() -> None:
    """Hide orbax's tracebacks after a failed write (one warning says it; JAXFLOWERS_DEBUG=1)."""
    if os.environ.get("JAXFLOWERS_DEBUG") == "1":
        return
    for name in ("absl", "asyncio"):
        if _drop_orbax not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_drop_orbax)
    if getattr(sys.unraisablehook, "__name__", "") != "_unraisable":
        previous = sys.unraisablehook

        def _unraisable(unraisable):
            error = unraisable.exc_value
            if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
                previous(unraisable)
        sys.unraisablehook = _unraisable


def _drop_orbax(record: logging.LogRecord) -> bool:
    """Keep a log record unless it comes from orbax or reports one of orbax's errors."""
    text = record.pathname + str(record.msg) + str(record.args)
    if record.exc_info and record.exc_info[2] is not None:
        frame = record.exc_info[2]
        while frame is not None:
            text += frame.tb_frame.f_code.co_filename
            frame = frame.tb_next
    return "orbax" not in text


# ---------------------------------------------------------------- the record


def record(iteration: int, history: History, options: TrainingOptions, data, *,
           model=None, digests: dict | None = None, data_digest: str | None = None) -> dict:
    """The JSON part of a checkpoint: iteration, history, recipe, data, model and digests."""
    return {"format": FORMAT, "iteration": int(iteration), "history": history.to_json(),
            "recipe": recipe(options), "data": data_record(data, data_digest),
            "model": model_record(model), "digests": digests or {}}


def recipe(options: TrainingOptions) -> dict:
    """The options that decide what a run computes, as JSON-able values."""
    from jaxflowers.schedules import spans_training

    values = {name: getattr(options, name) for name in recipe_fields()}
    values["initial_learn_rate"] = options.learn_rate
    values["squared_gradient_decay_factor"] = options.squared_decay
    values["augmentation"] = repr(values["augmentation"])
    values["metrics"] = list(options.metrics)
    values["learn_rate_factors"] = [list(pair) for pair in options.learn_rate_factors]
    schedule = options.learn_rate_schedule
    values["learn_rate_schedule"] = schedule if isinstance(schedule, str) else repr(schedule)
    values["schedule_epochs"] = options.max_epochs if spans_training(schedule) else None
    values["output_network"] = ("best-validation" if options.best_validation
                                else "last-iteration")
    return values


def data_record(data, digest: str | None = None) -> dict:
    return {"images": len(data), "image_shape": list(image_shape(data)),
            "class_names": [str(c) for c in data.class_names], "digest": digest}


def model_record(model) -> str | None:
    """The network in words ("cifar_net(depth=1, num_classes=10)"), to compare on resume."""
    if model is None:
        return None
    from jaxflowers.recipes import model_spec

    try:
        name, kwargs = model_spec(model)
    except TypeError:
        return type(model).__qualname__
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def tree_digests(tree, xp=np) -> dict:
    """``{path: uint32}``: a position-dependent sum of every leaf's bits, exact in any order,
    so devices (``xp=jax.numpy``) and host (numpy) agree bit for bit."""
    import jax

    def one(leaf):
        bits = _bits(leaf, xp)
        positions = xp.arange(bits.size, dtype=xp.uint32) * _SPREAD
        return xp.sum((bits.reshape(-1) ^ positions) * _MIX, dtype=xp.uint32)

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path): one(leaf) for path, leaf in flat}


def _bits(leaf, xp):
    if xp is np:
        leaf = np.asarray(leaf)
        return np.ascontiguousarray(leaf).view(np.uint32) if leaf.dtype.itemsize == 4 else \
            leaf.astype(np.uint32)
    import jax

    return (jax.lax.bitcast_convert_type(leaf, xp.uint32) if leaf.dtype.itemsize == 4
            else leaf.astype(xp.uint32))


def hex_digests(digests: dict) -> dict:
    return {path: f"{int(value):08x}" for path, value in digests.items()}
