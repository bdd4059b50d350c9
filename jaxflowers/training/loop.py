"""The training loop: dispatch blocks up to each sync point, read results there, stop.

A sync point is an iteration where the host must look at results (table row, validation,
checkpoint, plot, end). On accelerators it is read one sync point late, so the devices never
wait; a validation scores a device copy, so a late stop returns the network that decided it.
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

__all__ = ["Schedule", "TrainingLoop"]

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
    """When the host looks at results, in iterations (0: never)."""

    total: int  # iterations of the whole plan
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

    ``checkpoints`` is ``(checkpointer, record_fn(iteration, digests))`` or None; ``stop`` and
    ``stop_words`` hold the ``StopReason`` once training stops early, and its words.
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
        population = self.ready.population  # compiled once the first block is dispatched
        if self.early_stopping is not None and self.early_stopping.exhausted:
            self._stop(StopReason.PATIENCE)  # resumed from the checkpoint of the stop
        while done < self.schedule.total and not self._stopping(sync_point=True):
            limit = self.schedule.next_sync(done)
            point = _SyncPoint(limit, [])
            while done < limit and not self._stopping():
                state, metrics = self.ready.run(state, done, limit)
                if population is not None:
                    population.start()  # compiles while the devices train
                    population = None
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
        """Checkpoint ``state`` now if a signal stopped the run (unless it is the newest)."""
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
        """Fetch blocks' metrics (a host sync); record iterations up to the first non-finite."""
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
        """Whether training ended at a recorded point (divergence, patience): drop later results."""
        return self.stop is not None and self.stop.at_recorded_point

    def _stopping(self, *, sync_point: bool = False) -> bool:
        """Whether to stop dispatching (the same answer in every process)."""
        if self.stop is not None:
            return True
        signum = self.interrupt.signal if self.interrupt is not None else None
        flags = (_OUTPUT_FN * self.progress.stop_requested
                 | (_SIGINT if signum == signal.SIGINT else 0)
                 | (_SIGTERM if signum == signal.SIGTERM else 0))
        parallel = self.program.parallel
        # Several processes: only process 0 runs output_fn and a signal may reach any one, so
        # all OR their flags at sync points only (one small collective) and agree on blocks.
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
