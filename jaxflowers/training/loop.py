"""The training loop: dispatch blocks up to each sync point, read results there, stop.

A sync point is an iteration at which the host must look at results: a table row, a
validation, a checkpoint, a plot refresh, the end. The devices run blocks of iterations
between them with nothing read back. On accelerators the host reads a sync point's
results one sync point late, so the devices never wait for it; on CPUs at once.

Training stops at the end of the plan, when ``output_fn`` asks (every process then takes
process 0's answer), on SIGINT or SIGTERM in any process (``host.signals``), at the first
iteration whose training or validation loss (or gradient) is not finite (the state then
holds the last finite network; see ``step``), or at the validation where the objective
has run out of patience (``early_stopping``). ``stop`` says which (``StopReason``).

Validations that may decide the returned network score a copy of the network made on the
devices when they are dispatched; ``EarlyStopping`` keeps or drops it once its scores are
read. Nothing goes to the host per validation, and a stop decided one sync point late
still returns the network of the validation that decided it.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import signal
import sys
import time
from typing import Any

import jax
import numpy as np

from jaxflowers.inference import metrics
from jaxflowers.training.checkpoint import CheckpointSaveError
from jaxflowers.training.early_stopping import EarlyStopping
from jaxflowers.training.progress import Progress
from jaxflowers.training.stop import StopReason, divergence_words

_OUTPUT_FN, _SIGINT, _SIGTERM = 1, 2, 4  # stop flags, OR-ed over the processes


@dataclasses.dataclass
class _SyncPoint:
    """What was dispatched up to one sync point, waiting to be read."""

    done: int  # iterations dispatched when it was reached
    blocks: list  # (iterations in the block, its metrics on the device)
    validation: Any = None  # the validation pass's handle
    variables: Any = None  # the validated network's copy on the devices, when kept
    snapshot: Any = None  # a tree-form copy of the state to checkpoint


@dataclasses.dataclass
class Schedule:
    """When the host looks at results, in iterations.

    Attributes:
      total: iterations of the whole plan.
      verbose_frequency, validation_frequency, checkpoint_every: 0 where there is none.
      plot_every: 0, or iterations between plot refreshes.
    """

    total: int
    verbose_frequency: int = 0
    validation_frequency: int = 0
    checkpoint_every: int = 0
    plot_every: int = 0

    def next_sync(self, done: int) -> int:
        """The first iteration after ``done`` at which the host looks at results."""
        candidates = [self.total] + [_next_multiple(done, every) for every in (
            self.verbose_frequency, self.validation_frequency, self.checkpoint_every,
            self.plot_every) if every]
        if done == 0:
            candidates.append(1)  # MATLAB prints the first iteration
        return min(candidates)

    def validates(self, done: int) -> bool:
        return bool(self.validation_frequency) and (
            done % self.validation_frequency == 0 or done == self.total)

    def checkpoints(self, done: int) -> bool:
        return bool(self.checkpoint_every) and done % self.checkpoint_every == 0


class TrainingLoop:
    """Runs one training from ``start`` to the end of ``schedule`` (or an earlier stop).

    Args:
      program: the ``TrainProgram``; ``ready`` what its ``prepare`` returned.
      progress: where results go.
      schedule: the sync points.
      look_ahead: sync points by which the host reads results late (0 or 1).
      interrupt: a ``host.signals.Interrupt``, or None.
      checkpoints: ``(checkpointer, record_fn)`` or None; ``record_fn(iteration, digests)``
        gives a checkpoint's JSON record.
      early_stopping: judges the validations and keeps the networks they may return, or
        None (validated networks are then not copied).

    Attributes:
      stop, stop_words: the ``StopReason`` once training stops early, and its words.
    """

    def __init__(self, program, ready, progress: Progress, schedule: Schedule, *,
                 look_ahead: int, interrupt=None, checkpoints=None,
                 early_stopping: EarlyStopping | None = None):
        self.program, self.ready, self.progress, self.schedule = program, ready, progress, schedule
        self.look_ahead, self.interrupt, self.checkpoints = look_ahead, interrupt, checkpoints
        self.early_stopping = early_stopping
        self.stop: StopReason | None = None
        self.stop_words: str | None = None
        self.last_checkpoint = None
        self._validation_wait = 0.0

    def run(self, state, start: int = 0):
        """Train from iteration ``start``; returns the final state and the loop's timings."""
        queue: collections.deque[_SyncPoint] = collections.deque()
        done, t0 = start, time.perf_counter()
        if self.early_stopping is not None and self.early_stopping.exhausted:
            self._stop(StopReason.PATIENCE)  # resumed from the checkpoint of the stop
        while done < self.schedule.total and not self._stopping(sync_point=True):
            limit = self.schedule.next_sync(done)
            point = _SyncPoint(limit, [])
            while done < limit and not self._stopping():
                state, metrics = self.ready.run(state, limit)
                point.blocks.append((min(self.program.block_length, limit - done), metrics))
                done += point.blocks[-1][0]
                if self.progress.output_fn is not None and len(point.blocks) > 1:
                    self._drain(point.blocks[:-1])  # output_fn sees each iteration promptly
                    del point.blocks[:-1]
            point.done = done
            self._dispatch_extras(point, state)
            queue.append(point)
            while len(queue) > self.look_ahead:
                self._record(queue.popleft())
        while queue:
            self._record(queue.popleft())
        jax.block_until_ready(state)
        train_time = time.perf_counter() - t0
        images = (self.progress.iterations_done - start) * self.program.options.mini_batch_size
        timings = {"train_time": train_time, "validation_time": self._validation_wait,
                   "images_per_second": images / max(train_time - self._validation_wait, 1e-9)}
        return state, timings

    def final_checkpoint(self, state) -> None:
        """Checkpoint ``state`` now if a signal stopped the run, unless it is the newest
        already."""
        if self.checkpoints is None or self.stop is None or not self.stop.by_signal:
            return
        done = self.progress.iterations_done
        if self.last_checkpoint != done:
            self._save(done, self.program.tree_state(state))

    def _dispatch_extras(self, point: _SyncPoint, state) -> None:
        """Start the validation pass and the checkpoint copy due at ``point``."""
        if self.ready.validation is not None and self.schedule.validates(point.done):
            placed, _, stats = self.ready.validation
            keep = self.early_stopping is not None
            variables = self.program.variables(state, keep=keep)
            point.validation = self.program.forward.start(variables, placed, stats)
            point.variables = variables if keep else None
        if self.checkpoints is not None and self.schedule.checkpoints(point.done):
            point.snapshot = self.program.tree_state(state)

    def _record(self, point: _SyncPoint) -> None:
        """Hand a sync point's results to ``progress`` (waiting for them) and report."""
        if self._halted():
            return  # diverged (the device has skipped since) or out of patience
        self._drain(point.blocks)
        if self._halted():
            self.progress.show()
            return
        if point.validation is not None:
            t_val = time.perf_counter()
            logits = self.program.forward.fetch(point.validation)
            scores = metrics.score(logits, self.ready.validation[1],
                                   self.program.options.metrics)
            self._validation_wait += time.perf_counter() - t_val
            self.progress.add_validation(point.done, scores)
            if not math.isfinite(scores["loss"]):
                self._stop(StopReason.VALIDATION_DIVERGED, divergence_words(
                    scores["loss"], point.done, validation=True))
                self.progress.show()
                return
            if self.early_stopping is not None and self.early_stopping.judge(
                    point.done, scores, point.variables):
                self._stop(StopReason.PATIENCE)
        if point.snapshot is not None:
            self._save(point.done, point.snapshot)
        self.progress.show()

    def _drain(self, blocks) -> None:
        """Fetch finished blocks' metrics (a host sync) and record their iterations, up to
        and including the first one that was not finite."""
        fetched = self.program.parallel.get([m for _, m in blocks])
        for (count, _), block in zip(blocks, fetched):
            if self._halted():
                return
            finite = block["finite"][:count]
            bad = np.flatnonzero(finite == 0)
            count = int(bad[0]) + 1 if bad.size else count
            self.progress.add(block["loss"][:count], block["accuracy"][:count],
                              block["learn_rate"][:count])
            if bad.size:
                self._stop(StopReason.DIVERGED, divergence_words(
                    float(block["loss"][count - 1]), self.progress.iterations_done))

    def _save(self, iteration: int, snapshot) -> None:
        """Start the checkpoint of ``iteration``; a failed save warns, or stops the run."""
        checkpointer, record = self.checkpoints
        if self.early_stopping is not None:  # the best network so far travels along
            snapshot = {**snapshot, "best": self.early_stopping.best_so_far(snapshot)}
        digests = self.program.digests(snapshot)
        try:
            if checkpointer.save(iteration, snapshot, record(iteration, digests)):
                self.last_checkpoint = iteration
        except CheckpointSaveError as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            self._stop(StopReason.CHECKPOINT_FAILED, f"a checkpoint could not be written "
                                                     f"at iteration {iteration}")

    def _stop(self, reason: StopReason, words: str | None = None) -> None:
        self.stop, self.stop_words = reason, words or reason.value

    def _halted(self) -> bool:
        """Whether training ended at a recorded point (divergence, patience): results
        dispatched after it are not recorded."""
        return self.stop is not None and self.stop.at_recorded_point

    def _stopping(self, *, sync_point: bool = False) -> bool:
        """Whether to stop dispatching. With several processes only process 0 runs
        ``output_fn`` and a signal may reach any one of them: at each sync point every
        process takes the OR of all their flags (one small collective), and between sync
        points nothing changes, so every process dispatches the same blocks."""
        if self.stop is not None:
            return True
        signum = self.interrupt.signal if self.interrupt is not None else None
        flags = (_OUTPUT_FN * self.progress.stop_requested
                 | (_SIGINT if signum == signal.SIGINT else 0)
                 | (_SIGTERM if signum == signal.SIGTERM else 0))
        parallel = self.program.parallel
        if parallel.multiprocess:
            if not sync_point:
                return False
            flags = parallel.any_process(flags)
        if flags & _OUTPUT_FN:
            self._stop(StopReason.OUTPUT_FN)
        elif flags & _SIGTERM:
            self._stop(StopReason.TERMINATED)
        elif flags & _SIGINT:
            self._stop(StopReason.INTERRUPTED)
        return self.stop is not None


def _next_multiple(done: int, every: int) -> int:
    return (done // every + 1) * every
