"""``train``: MATLAB's ``trainnet`` on every local device, returning ``(net, info)``.

The loop dispatches blocks of iterations (``step.train_block`` on a resident set,
``step.train_streamed`` on one streamed from the host), keeps metrics on the device, and
synchronises with the host only where something is due: a table row, a validation, an
``output_fn`` call, the end.

With several processes (``parallel.initialize``) every process runs this same loop on its
own devices of the global mesh; only process 0 prints the table, draws the plot and calls
``output_fn``, and its stop request reaches the others (``DataParallel.from_main_process``).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxflowers.checks import check_training
from jaxflowers.data.loader import ResidentData, channel_stats, choose_placement, image_shape
from jaxflowers.info import TrainingInfo
from jaxflowers.net import TrainedNet
from jaxflowers.optim import learn_rate_schedule, make_optimizer
from jaxflowers.options import TrainingOptions
from jaxflowers.parallel import AXIS, DataParallel, select_devices
from jaxflowers.predict import Predictor, log_softmax
from jaxflowers.progress import Progress
from jaxflowers.step import (StepConfig, TrainState, init_program, train_block, train_streamed,
                             uses_flat_layout)

__all__ = ["TrainedNet", "TrainingInfo", "train"]


def train(data, model, options: TrainingOptions) -> tuple[TrainedNet, TrainingInfo]:
    """Train ``model`` on ``data`` with ``options`` over every selected device (``trainnet``).

    Args:
      data: an image set: uint8 ``images`` (N, H, W, C), int ``labels`` (N,),
        ``class_names``. It is copied once to every device, or streamed from the host
        when ``options.data_placement`` says so (or, on "auto", when it is too large).
      model: a flax module mapping (B, H, W, C) to (B, num_classes) logits; modules with
        ``dtype`` / ``bn_axis_name`` fields get the compute precision and, with
        ``sync_batch_norm``, the mesh axis.
      options: ``TrainingOptions``; ``mini_batch_size`` is the global batch.

    Returns:
      ``(net, info)``: a ``TrainedNet`` and a ``TrainingInfo``.

    With several processes (``parallel.initialize`` first), every process calls ``train``
    with the same data and options and gets the same ``(net, info)``; the devices are
    those of all processes and ``mini_batch_size`` is still the global batch. Only
    process 0 prints, plots and calls ``output_fn``.
    """
    if not isinstance(options, TrainingOptions):
        raise TypeError(f"options must be TrainingOptions, not {type(options).__name__}")
    check_training(data, model, options)
    parallel = DataParallel(select_devices(options.execution_environment, options.num_devices),
                            options.strategy)
    _check_batch(options, parallel.num_devices, len(data))
    run = _Run(data, model, options, parallel)
    return run.execute()


class _Run:
    """One training: placed data, compiled functions, the loop."""

    def __init__(self, data, model, options: TrainingOptions, parallel: DataParallel):
        self.options, self.parallel, self.data = options, parallel, data
        self.dtype = _compute_dtype(options.precision, parallel.devices)
        self.model = _configure(model, self.dtype, None)
        self.placement = self._choose_placement(options.data_placement, data)
        self.streamed = self.placement.kind == "stream"
        self.feed = self._place_data(data)
        self.steps_per_epoch = self.feed.steps_per_epoch
        self.total = self.steps_per_epoch * options.max_epochs
        shape = image_shape(data)
        self.input_shape = (options.augmentation.output_shape(shape) if options.augmentation
                            else shape)
        # Per-channel (mean, std) of the training images: measured while compiling
        # (``_measure``); until then only their shapes, which is all compiling needs.
        self.normalization = self.stats = None
        channels = jax.ShapeDtypeStruct((shape[-1],), jnp.float32)
        self.stats_shape = parallel.abstract((channels, channels))
        tx = make_optimizer(options, self.steps_per_epoch)
        platform = parallel.devices[0].platform
        # Initialised unmapped, so with the per-device batch norm of `self.model`; traced
        # once, here: the traced parameters also give the one-vector layout (on GPUs).
        self.init = init_program(self.model, tx, self.input_shape, options.seed,
                                 uses_flat_layout(options.parameter_layout, platform) or None)
        self.state_shapes = parallel.abstract(self.init.eval_shape())
        self.cfg = StepConfig(
            model=_configure(model, self.dtype, AXIS if options.sync_batch_norm else None),
            tx=tx, schedule=learn_rate_schedule(options, self.steps_per_epoch),
            augmentation=options.augmentation, dtype=self.dtype,
            sync_batch_norm=options.sync_batch_norm, flat=self.init.flat)
        # A streamed batch arrives per iteration, so a dispatch runs one.
        self.block = 1 if self.streamed else _block_length(options, self.input_shape, platform)
        self.validation = self._prepare_validation(options.validation_data)

    def execute(self) -> tuple[TrainedNet, TrainingInfo]:
        t0 = time.perf_counter()
        init, shapes = self.init, self.state_shapes
        try:
            # Independent work at once: the initial weights (compiled and placed), the
            # training block's compilation (the longest: 11-14 s for ResNet-50 on an H200
            # host), the validation set's copy and pass's compilation, the training set's
            # copy and statistics (``ResidentData`` copies in its own thread). A process's
            # first copy to a GPU costs ~1.8 s whatever its size, so the main thread copies
            # nothing before the block is traced.
            with concurrent.futures.ThreadPoolExecutor(5, "jaxflowers-compile") as pool:
                state = pool.submit(lambda: self.parallel.put(init()))
                measured = pool.submit(self._measure)
                # Traced first and alone (tracing holds the GIL): its compilation is the
                # longest, so it starts before anything else is traced.
                block = pool.submit(self._lower(shapes).compile)
                validation = None
                if self.validation is not None:
                    predictor, placed, labels = self.validation
                    data = self.options.validation_data  # read (a folder's gathered) there
                    validation = (pool.submit(lambda: predictor.place(np.asarray(data.images))),
                                  pool.submit(predictor.compile, shapes.stored_variables(),
                                              placed, self.stats_shape))
                step_fn = self.feed.use(block.result())
                state, _ = state.result(), measured.result()
                if validation:
                    validation[1].result()  # raises what the compilation raised
                    self.validation = (predictor, validation[0].result(), labels)
            compile_time = time.perf_counter() - t0
            progress = self._progress()
            progress.start(self._summary())
            state, timings = self._loop(step_fn, state, progress)
        finally:
            self.feed.close()  # the feed's threads (copy, readers), also on early stop or error
        info = progress.finish(compile_time=compile_time, num_devices=self.parallel.num_devices,
                               data_placement=self.placement.kind, **timings)
        return self._net(state), info

    def _measure(self) -> None:
        """The training images' per-channel (mean, std), on the host and placed: a resident
        set is measured on its devices once copied, a streamed one on the host."""
        self.normalization = (channel_stats(self.data.images) if self.streamed
                              else self.feed.channel_stats())
        self.stats = self.parallel.put(self.normalization)

    def _choose_placement(self, requested: str, data):
        """Resident or streamed, by this process's devices; with several processes, process
        0's choice, as processes running different feeds would wait on each other forever."""
        placement = choose_placement(requested, data, self.parallel.local_devices)
        streamed = self.parallel.from_main_process(np.int32(placement.kind == "stream"))
        return placement._replace(kind="stream" if streamed else "resident")

    def _place_data(self, data):
        """The feed: ``ResidentData`` (copied to every device) or ``StreamedData`` (grain)."""
        feed = ResidentData
        if self.streamed:
            from jaxflowers.data.stream import StreamedData  # grain loads only when streaming
            feed = StreamedData
        opts = self.options
        return feed.place(self.parallel, data, mini_batch_size=opts.mini_batch_size,
                          num_epochs=opts.max_epochs, shuffle=opts.shuffle, seed=opts.seed)

    def _lower(self, state):
        """The traced dispatch of the feed (``jax.stages.Lowered``); ``self.feed.use`` of its
        compilation is ``run(state, stats, limit) -> (state, metrics)``."""
        if self.streamed:
            fn = functools.partial(train_streamed, cfg=self.cfg)
        else:
            fn = functools.partial(train_block, cfg=self.cfg, length=self.block)
        return self.feed.lower(fn, state, self.stats_shape)

    def _loop(self, step_fn, state, progress: Progress):
        opts = self.options
        lag = _look_ahead(opts, self.parallel.devices[0].platform)
        queue: collections.deque = collections.deque()  # per sync point: (blocks, validation)
        done, t0, val_wait = 0, time.perf_counter(), 0.0
        while done < self.total and not self._stopping(progress):
            limit = min(self._next_sync(done), self.total)
            blocks = []
            while done < limit and not self._stopping(progress):
                state, metrics = step_fn(state, self.stats, limit)
                blocks.append((min(self.block, limit - done), metrics))
                done += blocks[-1][0]
                if opts.output_fn is not None and len(blocks) > 1:
                    _drain(blocks[:-1], progress, self.parallel)
                    del blocks[:-1]
            validation = None
            if self._validation_due(done):
                predictor, placed, _ = self.validation
                validation = done, predictor.start(state.stored_variables(), placed, self.stats)
            queue.append((blocks, validation))
            while len(queue) > lag:
                val_wait += self._record(*queue.popleft(), progress)
        while queue:
            val_wait += self._record(*queue.popleft(), progress)
        jax.block_until_ready(state)
        train_time = time.perf_counter() - t0
        images = progress.iterations_done * opts.mini_batch_size
        return state, {"train_time": train_time, "validation_time": val_wait,
                       "images_per_second": images / max(train_time - val_wait, 1e-9)}

    def _record(self, blocks, validation, progress: Progress) -> float:
        """Hand a sync point's metrics and validation to ``progress`` (waiting for them)
        and report; returns the seconds spent waiting for the validation."""
        _drain(blocks, progress, self.parallel)
        waited = 0.0
        if validation is not None:
            t_val = time.perf_counter()
            iteration, handle = validation
            progress.add_validation(iteration, *self._score(self.validation[0].fetch(handle)))
            waited = time.perf_counter() - t_val
        progress.report()
        return waited

    def _stopping(self, progress: Progress) -> bool:
        """Whether ``output_fn`` asked to stop. With several processes only process 0 runs
        it, so every process takes its answer (a small collective, only with output_fn)."""
        if self.options.output_fn is not None and self.parallel.multiprocess:
            progress.stop_requested = bool(self.parallel.from_main_process(
                np.bool_(progress.stop_requested)))
        return progress.stop_requested

    def _next_sync(self, done: int) -> int:
        """The next iteration after ``done`` at which the host must look at results."""
        opts, nxt = self.options, done + 1
        candidates = [self.total, _next_multiple(done, opts.verbose_frequency)]
        if done == 0:
            candidates.append(nxt)  # MATLAB prints the first iteration
        if self.validation is not None:
            candidates.append(_next_multiple(done, opts.validation_frequency))
        if opts.plots != "none":
            candidates.append(_next_multiple(done, max(1, self.steps_per_epoch // 4)))
        return min(candidates)

    def _validation_due(self, done: int) -> bool:
        return self.validation is not None and (
            done % self.options.validation_frequency == 0 or done == self.total)

    def _prepare_validation(self, data):
        if data is None:
            return None
        if image_shape(data) != self.input_shape:
            raise ValueError(f"validation_data images are {image_shape(data)} but "
                             f"training feeds the network {self.input_shape}")
        per_device = self.options.mini_batch_size // self.parallel.num_devices
        predictor = Predictor(self.parallel, self.model, self.dtype, per_device, self.cfg.flat)
        # Placed while compiling (``execute``); the pass compiles against its shape.
        return predictor, predictor.abstract(len(data), self.input_shape), np.asarray(data.labels)

    def _score(self, logits: np.ndarray) -> tuple[float, float]:
        """Validation loss and accuracy (a fraction) from the validation set's logits."""
        labels = self.validation[2]
        log_probs = log_softmax(logits)
        loss = -np.mean(log_probs[np.arange(len(labels)), labels])
        return float(loss), float(np.mean(np.argmax(log_probs, axis=1) == labels))

    def _progress(self) -> Progress:
        """The table, plot and ``output_fn`` on process 0; other processes only record."""
        main, plot = self.parallel.is_main_process, None
        if self.options.plots == "training-progress" and main:
            from jaxflowers.plots import TrainingProgressPlot
            plot = TrainingProgressPlot()
        return Progress(steps_per_epoch=self.steps_per_epoch,
                        verbose=self.options.verbose and main,
                        verbose_frequency=self.options.verbose_frequency,
                        output_fn=self.options.output_fn if main else None, plot=plot)

    def _summary(self) -> str:
        kinds = sorted({d.device_kind for d in self.parallel.devices})
        processes = (f" in {self.parallel.process_count} processes"
                     if self.parallel.multiprocess else "")
        return (f"Training on {self.parallel.num_devices} x {'/'.join(kinds)}{processes} "
                f"({self.parallel.strategy}, {jnp.dtype(self.dtype).name}), "
                f"{len(self.data)} images, {self.steps_per_epoch} iterations per epoch, "
                f"mini-batch {self.options.mini_batch_size}, {self.block} iteration(s) per "
                f"dispatch, {self.placement.describe()}")

    def _net(self, state: TrainState) -> TrainedNet:
        # Fetched as stored, then unravelled on the host (numpy slices, nothing compiled).
        variables = self.cfg.unpack(self.parallel.get(state.stored_variables()))
        return TrainedNet(model=self.model, variables=variables,
                          class_names=tuple(self.data.class_names),
                          normalization=self.normalization, input_shape=self.input_shape)


def _drain(pending, progress: Progress, parallel: DataParallel) -> None:
    """Fetch finished blocks' metrics (a host sync) and hand the real iterations on."""
    fetched = parallel.get([m for _, m in pending])
    for (count, _), metrics in zip(pending, fetched):
        progress.add(metrics["loss"][:count], metrics["accuracy"][:count],
                     metrics["learn_rate"][:count])


def _next_multiple(done: int, every: int) -> int:
    return (done // every + 1) * every


def _look_ahead(options: TrainingOptions, platform: str) -> int:
    """Sync points by which the host reads results (metrics, validation) late.

    1 on accelerators: the devices already run the next iterations while the host reads a
    sync point's results, so they never wait for the host between validations (on 2 H200s
    the MATLAB example's training took 2.4 s more than its 960 steps: ~30 ms for each of
    its 80 validations). 0 with ``output_fn``, which may stop training on what it sees, so
    it sees every result as soon as it exists. 0 on XLA:CPU, where the "devices" are the
    host's own cores (nothing to overlap; with several of them every call waits anyway,
    ``DataParallel.lockstep``)."""
    return 0 if options.output_fn is not None or platform == "cpu" else 1


def _block_length(options: TrainingOptions, image_shape, platform: str) -> int:
    """Iterations per dispatch. On GPUs, small images run 16 iterations per dispatch so
    Python never paces the device; a large-image step outlasts its dispatch, so 1. XLA:CPU
    runs convolutions inside loops many times slower than outside, so 1 there too."""
    if options.steps_per_dispatch is not None:
        return options.steps_per_dispatch
    small = image_shape[0] * image_shape[1] < 96 * 96
    return 16 if small and platform != "cpu" else 1


def _compute_dtype(precision: str, devices):
    if precision == "auto":
        return jnp.bfloat16 if devices[0].platform == "gpu" else jnp.float32
    return jnp.dtype(precision).type


def _configure(model, dtype, bn_axis_name):
    """The module with the compute dtype and batch-norm axis set, where it has those fields."""
    fields = {f.name for f in dataclasses.fields(model)} if dataclasses.is_dataclass(model) else set()
    changes = {k: v for k, v in (("dtype", dtype), ("bn_axis_name", bn_axis_name)) if k in fields}
    return model.clone(**changes) if changes else model


def _check_batch(options: TrainingOptions, num_devices: int, num_samples: int) -> None:
    batch = options.mini_batch_size
    if batch % num_devices:
        raise ValueError(f"mini_batch_size={batch} is not divisible by {num_devices} devices; "
                         f"use a multiple of {num_devices} or scale_for_devices")
    if batch > num_samples:
        raise ValueError(f"mini_batch_size={batch} is larger than the {num_samples} training "
                         "images, so an epoch would have no complete mini-batch")
