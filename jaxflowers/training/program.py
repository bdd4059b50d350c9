"""``TrainProgram``: the one owner of what a training compiles and runs on the devices.

Everything that leaves it is the model's own parameter tree: the flat vector stays inside.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxflowers.data.feed import ResidentData
from jaxflowers.inference.forward import ForwardPass
from jaxflowers.options.execution import Resolved
from jaxflowers.options.training import TrainingOptions
from jaxflowers.parallel.data_parallel import AXIS, REPLICATED, DataParallel, sharded
from jaxflowers.training import checkpoint, feeding, learn_rates, population
from jaxflowers.training.layout import Layout, flat_layout
from jaxflowers.training.optimizer import Solver, hyperparameters
from jaxflowers.training.step import (
    SEED,
    StepConfig,
    TrainState,
    init_program,
    init_variables,
    train_block,
    train_streamed,
)

__all__ = ["Ready", "TrainProgram"]


@dataclasses.dataclass
class Ready:
    """What ``TrainProgram.prepare`` hands the loop: everything placed and compiled."""

    state: TrainState  # placed on every device
    run: Callable  # run(state, first, limit) -> (state, metrics): one dispatch
    normalization: tuple[np.ndarray, np.ndarray]  # per-channel (mean, std) on the host
    validation: Any = None  # (placed images, labels, stats) of the validation set, or None
    population: Callable | None = None  # placed variables -> with population statistics
    # Seconds from the start of ``prepare`` to the end of its last "compile" task (compiling,
    # and running the initial state's program) and of its last "placing" task (data copied,
    # channel statistics measured); the two overlap.
    seconds: dict = dataclasses.field(default_factory=dict)


class _Clock:
    """When the last task of each kind ended, in seconds since the clock was made."""

    def __init__(self):
        self.start, self.ends, self._lock = time.perf_counter(), {}, threading.Lock()

    def timed(self, kind: str, fn: Callable) -> Callable:
        def run(*args):
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self.ends[kind] = max(self.ends.get(kind, 0.0),
                                          time.perf_counter() - self.start)
        return run


class _AfterTraining:
    """A program needed only after the last iteration, compiled in a thread of its own while
    training runs; calling it with ``variables`` waits for it, then runs it on ``arrays``.

    ``start`` begins the compilation; the loop calls it once the first block is dispatched, so
    its tracing does not hold the interpreter while the set-up and the first dispatch want it.
    """

    def __init__(self, compile_fn: Callable, program, arrays, stats):
        self._arrays, self._stats = arrays, stats
        self._compile_fn, self._program = compile_fn, program
        self._compiled: concurrent.futures.Future = concurrent.futures.Future()
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin compiling in a thread (once; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._compile, daemon=True,  # daemon: never holds exit
                         name="jaxflowers-compile-after").start()

    def _compile(self) -> None:
        try:
            self._compiled.set_result(self._compile_fn(self._program))
        except BaseException as error:  # noqa: BLE001 (raised to the caller of __call__)
            self._compiled.set_exception(error)

    def __call__(self, variables):
        self.start()  # no block was dispatched (nothing left to train): compile now
        return self._compiled.result()(variables, arrays=self._arrays, stats=self._stats)


class TrainProgram:
    """Compiles and runs one training's programs on ``parallel``'s devices.

    ``feed`` holds host arrays only; ``input_shape`` is the (H, W, C) the network sees;
    ``start``: a network to start from (``models.Pretrained`` or ``TrainedNet``: its
    ``variables`` replace the drawn ones, its ``normalization`` the data's), or None.
    """

    def __init__(self, parallel: DataParallel, model, options: TrainingOptions,
                 resolved: Resolved, *, feed, input_shape, sync_batch_norm: bool = False,
                 start=None):
        self.parallel, self.options, self.feed = parallel, options, feed
        self.start = None if start is None else start.variables
        self.fixed_normalization = None if start is None else start.normalization
        self.input_shape, self.block_length = tuple(input_shape), resolved.steps_per_dispatch
        self.dtype = jnp.bfloat16 if resolved.precision == "bfloat16" else jnp.float32
        self.model = _configure(model, self.dtype, None)  # per-device batch norm: init, forward
        steps = feed.steps_per_epoch
        initial = init_variables(self.model, self.input_shape)
        variables = jax.eval_shape(initial, SEED)  # one trace of the model's init, reused
        flat = flat_layout(variables) if resolved.flat_parameters else None
        factors = learn_rates.factors(options.learn_rate_factors, variables["params"])
        self.frozen = learn_rates.frozen_norms(factors, variables["params"],
                                               variables.get("batch_stats", {}))
        solver = Solver(options, steps, flat, None if factors is None else tuple(factors))
        tx, _ = solver()  # its state's layout does not depend on the hyperparameters' values
        self.layout = Layout(flat, tx)
        self.init = init_program(initial, tx, flat)
        self._local_shapes = jax.eval_shape(self.init, SEED, self.start)
        self.state_shapes = parallel.abstract(self._local_shapes)
        self.cfg = StepConfig(
            model=_configure(model, self.dtype, AXIS if sync_batch_norm else None),
            solver=solver, augmentation=options.augmentation,
            dtype=self.dtype, sync_batch_norm=sync_batch_norm, flat=flat,
            factors=None if factors is None else tuple(factors), frozen=self.frozen)
        channels = jax.ShapeDtypeStruct((feed.shape[-1],), jnp.float32)
        self.stats_shape = parallel.abstract((channels, channels))
        self.hyper = hyperparameters(options)
        per_device = options.mini_batch_size // parallel.num_devices
        self.forward = ForwardPass(parallel, self.model, self.dtype, per_device)
        self._to_tree = parallel.wrap(self.layout.to_tree, (REPLICATED,), REPLICATED)
        self._unpack = (None if flat is None else
                        parallel.wrap(self.layout.variables, (REPLICATED,), REPLICATED))
        self._snapshot = parallel.wrap(self.layout.copy_variables, (REPLICATED,), REPLICATED)
        self._digest = None  # the checkpoints' digest program, built at the first one
        # Population statistics: with batch norm pooled over the global batch (population.py).
        self.recomputes_statistics = (options.batch_normalization_statistics == "population"
                                      and bool(jax.tree.leaves(variables.get("batch_stats"))))
        self.population_model = _configure(model, self.dtype, AXIS)

    # ------------------------------------------------------------------ preparation

    def prepare(self, validation_data=None, restored: dict | None = None, start: int = 0,
                *, checkpoints: bool = False, snapshots: bool = False) -> Ready:
        """Place and compile everything at once, in threads (compiling needs only shapes); the
        population pass compiles while training runs.

        ``restored`` is a tree-form host state to continue at iteration ``start``; ``snapshots``:
        validations keep copies of the networks they score."""
        clock = _Clock()
        compiling, placing = functools.partial(clock.timed, "compile"), functools.partial(
            clock.timed, "placing")
        with concurrent.futures.ThreadPoolExecutor(6, "jaxflowers-compile") as pool:
            state = pool.submit(compiling(self._initial_state), restored)
            placed = pool.submit(placing(feeding.place), self.parallel, self.feed, start,
                                 self.fixed_normalization)
            block = pool.submit(compiling(self.lower_block().compile))  # the longest: first
            stored = self.state_shapes.stored_variables()
            readers = [pool.submit(compiling(self._compile_reader), name, shapes)
                       for name, shapes, due in (
                           ("_unpack", stored, self._unpack is not None and (
                               validation_data is not None or self.recomputes_statistics)),
                           ("_snapshot", stored, snapshots and validation_data is not None),
                           ("_to_tree", self.state_shapes, checkpoints)) if due]
            validation = None
            if validation_data is not None:
                abstract = self.forward.abstract(len(validation_data), self.input_shape)
                validation = (
                    pool.submit(placing(lambda: self.forward.place(
                        np.asarray(validation_data.images)))),
                    pool.submit(compiling(self.forward.compile), self.variable_shapes(),
                                abstract, self.stats_shape))
            for reader in readers:
                reader.result()
            arrays, stats, normalization = placed.result()
            run = feeding.runner(self.parallel, self.feed, block.result(), arrays, stats,
                                 self.parallel.put(self.hyper), self.block_length)
            ready = Ready(state.result(), run, normalization)
            if validation:
                validation[1].result()  # raises what the compilation raised
                ready.validation = (validation[0].result(),
                                    np.asarray(validation_data.labels, np.int64), stats)
        ready.seconds = dict(clock.ends)
        if self.recomputes_statistics:
            # why after the set-up: it runs once, after the last iteration, and compiled beside
            # the training block it slowed the block's compile
            ready.population = _AfterTraining(population.compile_pass, self, arrays, stats)
        return ready

    def _compile_reader(self, name: str, shapes) -> None:
        """Replace the wrapped function ``self.<name>`` by its compilation for ``shapes``."""
        setattr(self, name, getattr(self, name).lower(shapes).compile())

    def _initial_state(self, restored):
        if restored is None:
            return self.parallel.put(self.init(np.uint32(self.options.seed), self.start))
        return self.parallel.put(self.state_from_tree(restored))

    def lower_block(self):
        """The training dispatch traced against shapes (``jax.stages.Lowered``)."""
        state, stats = self.state_shapes, self.stats_shape
        hyper = self.parallel.abstract(jax.eval_shape(lambda: self.hyper))
        if isinstance(self.feed, ResidentData):
            fn = functools.partial(train_block, cfg=self.cfg, length=self.block_length)
            specs = (REPLICATED, REPLICATED, REPLICATED, sharded(1), REPLICATED, REPLICATED,
                     REPLICATED, REPLICATED)
            wrapped = self.parallel.wrap(fn, specs, (REPLICATED, REPLICATED), donate_argnums=(0,))
            images, labels, first_row, limit = self.parallel.abstract((
                jax.ShapeDtypeStruct(self.feed.shape, np.uint8),
                jax.ShapeDtypeStruct(self.feed.shape[:1], np.int32),
                jax.ShapeDtypeStruct((), np.int32), jax.ShapeDtypeStruct((), np.int32)))
            rows = (self.feed.window_rows(self.block_length), self.feed.order.shape[1])
            order = self.parallel.abstract(jax.ShapeDtypeStruct(rows, np.int32), sharded(1))
            return wrapped.lower(state, images, labels, order, first_row, stats, hyper, limit)
        fn = functools.partial(train_streamed, cfg=self.cfg)
        specs = (REPLICATED, sharded(0), sharded(0), REPLICATED, REPLICATED)
        wrapped = self.parallel.wrap(fn, specs, (REPLICATED, REPLICATED), donate_argnums=(0,))
        batch = jax.ShapeDtypeStruct(self.feed.batch_shape, np.uint8)
        labels = jax.ShapeDtypeStruct(self.feed.batch_shape[:1], np.int32)
        if self.parallel.multiprocess:  # the global batch: every process's columns
            scale = self.parallel.process_count
            batch = jax.ShapeDtypeStruct((batch.shape[0] * scale, *batch.shape[1:]), np.uint8)
            labels = jax.ShapeDtypeStruct((labels.shape[0] * scale,), np.int32)
        images, labels = self.parallel.abstract((batch, labels), sharded(0))
        return wrapped.lower(state, images, labels, stats, hyper)

    # ------------------------------------------------------------------ reading the state

    def variable_shapes(self):
        """Placed shapes of the model's variables in tree form (what validation takes)."""
        return self.parallel.abstract(self.variable_shapes_local())

    def variable_shapes_local(self):
        """Shapes of the model's variables in tree form on one device."""
        return jax.eval_shape(self.layout.variables, self._local_shapes.stored_variables())

    def variables(self, state: TrainState, *, keep: bool = False):
        """The model's variables as a placed tree; ``keep``: a copy that outlives ``state``."""
        stored = state.stored_variables()
        if keep:
            return self._snapshot(stored)
        return stored if self._unpack is None else self._unpack(stored)

    def host_variables(self, state: TrainState) -> dict:
        """The model's variables as numpy arrays (fetched as stored, unravelled on the host)."""
        return self.layout.variables(self.parallel.get(state.stored_variables()))

    def tree_state(self, state: TrainState):
        """A placed tree-form copy of ``state``, safe to keep (the next block donates ``state``)."""
        return self._to_tree(state)

    def digests(self, tree) -> dict:
        """``checkpoint.tree_digests`` of a placed tree, computed on the devices, as hex."""
        if self._digest is None:
            self._digest = self.parallel.wrap(
                functools.partial(checkpoint.tree_digests, xp=jnp), (REPLICATED,), REPLICATED)
        return checkpoint.hex_digests(self.parallel.get(self._digest(tree)))

    def tree_state_shapes(self):
        """Shapes and dtypes (no sharding) of ``tree_state``'s result."""
        return jax.eval_shape(self.layout.to_tree, self._local_shapes)

    def state_from_tree(self, tree: dict) -> TrainState:
        """A host ``TrainState`` in this program's layout from a tree-form state."""
        return self.layout.from_tree(tree, TrainState)


def _configure(model, dtype, bn_axis_name):
    """The module with the compute dtype and batch-norm axis set, where it has those fields."""
    fields = ({f.name for f in dataclasses.fields(model)} if dataclasses.is_dataclass(model)
              else set())
    changes = {k: v for k, v in (("dtype", dtype), ("bn_axis_name", bn_axis_name)) if k in fields}
    return model.clone(**changes) if changes else model
