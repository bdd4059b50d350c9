"""``train``: MATLAB's ``trainnet`` on every local device, returning ``(net, info)``.

With several processes each runs ``train`` on its devices of the global mesh; only process 0
prints the table, draws the plot and calls ``output_fn``.
"""
from __future__ import annotations

import os
import time

import numpy as np

from jaxflowers.data.digests import set_digest
from jaxflowers.data.feed import ResidentData, choose_placement, image_shape
from jaxflowers.host import signals
from jaxflowers.inference.net import TrainedNet
from jaxflowers.models.weights import Pretrained
from jaxflowers.options.execution import ExecutionOptions
from jaxflowers.options.training import TrainingOptions
from jaxflowers.parallel.data_parallel import DataParallel, select_devices
from jaxflowers.training import checkpoint as checkpoint_lib
from jaxflowers.training import resume as resume_lib
from jaxflowers.training.bar import TrainingBar
from jaxflowers.training.early_stopping import EarlyStopping, keeps_networks, returned_network
from jaxflowers.training.history import History
from jaxflowers.training.info import TrainingInfo
from jaxflowers.training.inputs import check_training
from jaxflowers.training.loop import Schedule, TrainingLoop
from jaxflowers.training.program import TrainProgram
from jaxflowers.training.progress import Progress
from jaxflowers.training.stop import StopReason
from jaxflowers.training.table import VerboseTable

__all__ = ["TrainedNet", "TrainingInfo", "train"]


def train(data, model, options: TrainingOptions, *, execution: ExecutionOptions | None = None,
          resume: str | os.PathLike | None = None) -> tuple[TrainedNet, TrainingInfo]:
    """Train ``model`` on ``data`` with ``options`` over every selected device (``trainnet``).

    Args:
      data: an image set: uint8 ``images`` (N, H, W, C), int ``labels`` (N,), ``class_names``.
      model: a flax module mapping (B, H, W, C) images to (B, num_classes) logits; its
        ``dtype`` / ``bn_axis_name`` fields, if any, are set to the run's. Or a network to
        start from (transfer learning): a ``models.Pretrained`` or a ``TrainedNet``; what it
        lacks (a fresh head) is drawn from ``options.seed``, and its ``normalization``
        replaces the training set's statistics.
      options: ``TrainingOptions``; ``mini_batch_size`` is the global batch.
      execution: ``ExecutionOptions`` or a dict of its fields; default: every "auto".
      resume: a checkpoint folder of an earlier run (or one of its checkpoints) to continue.

    Returns:
      ``(net, info)``: the ``TrainedNet`` (best validated or last finite, per
      ``output_network``) and the ``TrainingInfo`` (``info.stop_reason`` says why it ended).
      Every process of a multi-process run gets the same.

    Raises:
      ValueError: data, model and options that do not fit together (naming both sides).
    """
    called = time.perf_counter()  # info.setup_time runs from here to the first step
    if not isinstance(options, TrainingOptions):
        raise TypeError(f"options must be TrainingOptions, not {type(options).__name__}")
    model, start = ((model.model, model) if isinstance(model, (Pretrained, TrainedNet))
                    else (model, None))
    check_training(data, model, options)
    if options.log_dir is not None:  # an optional package, asked for before any work
        from jaxflowers.training.tensorboard import summary_writer
        summary_writer(options.log_dir)
    execution = _execution(execution)
    parallel = DataParallel(select_devices(options.execution_environment, execution.num_devices),
                            execution.strategy)
    _check_batch(options, parallel.num_devices, len(data))
    feed = _feed(data, options, execution, parallel)
    shape = image_shape(data)
    input_shape = options.augmentation.output_shape(shape) if options.augmentation else shape
    platform = parallel.devices[0].platform
    resolved = execution.resolve(platform, input_shape, streamed=feed.kind == "stream")
    program = TrainProgram(parallel, model, options, resolved, feed=feed,
                           input_shape=input_shape, sync_batch_norm=execution.sync_batch_norm,
                           start=start)
    shapes = program.tree_state_shapes()
    if keeps_networks(options):  # checkpoints hold the best network too
        shapes = {**shapes, "best": program.variable_shapes_local()}
    digest = (set_digest(data)
              if resume is not None or options.checkpoint_path is not None else None)
    restored = (resume_lib.restore(resume, shapes, options, data, model=program.model,
                                   data_digest=digest) if resume is not None else None)
    return _Run(program, options, parallel, data, restored, digest).execute(called)


class _Run:
    """One training's pieces, put together: progress, checkpoints, the loop."""

    def __init__(self, program: TrainProgram, options: TrainingOptions,
                 parallel: DataParallel, data, restored, data_digest: str | None):
        self.program, self.options, self.parallel, self.data = program, options, parallel, data
        self.restored, self.data_digest = restored, data_digest
        self.start = restored.iteration if restored else 0
        steps = program.feed.steps_per_epoch
        self.history = restored.history if restored else History(steps, options.metrics)
        self.history.max_epochs = options.max_epochs
        self.total = steps * options.max_epochs

    def execute(self, called: float) -> tuple[TrainedNet, TrainingInfo]:
        """Train; ``called``: ``time.perf_counter()`` when ``train`` was called."""
        checkpoints = self._checkpointer()
        with signals.catch() as interrupt:
            try:
                ready = self.program.prepare(
                    self.options.validation_data, self.restored and self.restored.state,
                    self.start, checkpoints=checkpoints is not None,
                    snapshots=keeps_networks(self.options))
                progress = self._progress()
                progress.start(self._summary())
                setup_time = time.perf_counter() - called
                early_stopping = self._early_stopping()
                loop = TrainingLoop(self.program, ready, progress, self._schedule(),
                                    look_ahead=_look_ahead(self.options, self.parallel),
                                    interrupt=interrupt, checkpoints=checkpoints,
                                    early_stopping=early_stopping)
                state, timings = loop.run(ready.state, self.start)
                loop.final_checkpoint(state)
                chosen = early_stopping.chosen(loop.stop) if early_stopping else None
                output = returned_network(self.program, ready, chosen, loop.stop, state,
                                          self.history)
            finally:
                self.program.feed.close()  # grain's readers, also on early stop or error
                written = checkpoints[0].finish() if checkpoints is not None else None
        stopped_by = loop.stop or StopReason.MAX_EPOCHS
        info = progress.close(
            compile_time=ready.seconds.get("compile", 0.0),
            placing_time=ready.seconds.get("placing", 0.0), setup_time=setup_time,
            num_devices=self.parallel.num_devices,
            data_placement=self.program.feed.kind,
            stopped_early=stopped_by is not StopReason.MAX_EPOCHS, stopped_by=stopped_by,
            stop_reason=loop.stop_words or stopped_by.value, **timings,
            **output.info_fields(self.options.metrics),
            checkpoint=None if written is None else str(written))
        net = TrainedNet(model=self.program.model, variables=output.variables,
                         class_names=tuple(self.data.class_names),
                         normalization=ready.normalization, input_shape=self.program.input_shape)
        return net, info

    def _early_stopping(self) -> EarlyStopping | None:
        """The judge of the validations (with a resumed run's best), or None if none is needed."""
        if not keeps_networks(self.options):
            return None
        early = EarlyStopping(self.options, self.history)
        if self.restored is not None and early.objective.best_iteration is not None:
            early.best = (early.objective.best_iteration,
                          self.parallel.put(self.restored.state["best"]))
        return early

    def _checkpointer(self):
        if self.options.checkpoint_path is None:
            return None
        checkpointer = checkpoint_lib.Checkpointer(
            self.options.checkpoint_path, self.options.checkpoint_keep,
            on_failure=self.options.checkpoint_failure, resuming=self.restored is not None,
            owner=self.parallel.is_main_process, background=not self.parallel.multiprocess)
        return checkpointer, lambda iteration, digests: checkpoint_lib.record(
            iteration, self.history, self.options, self.data, model=self.program.model,
            digests=digests, data_digest=self.data_digest)

    def _schedule(self) -> Schedule:
        opts, steps = self.options, self.program.feed.steps_per_epoch
        every = opts.checkpoint_frequency * (steps if opts.checkpoint_frequency_unit == "epoch"
                                             else 1)
        # verbose_frequency makes sync points whether or not a table is printed: every
        # process keeps the same ones (they decide its collectives), and output_fn sees
        # each of those iterations at once (bench.py times windows between them).
        return Schedule(
            total=self.total, verbose_frequency=opts.verbose_frequency,
            validation_frequency=opts.validation_frequency if opts.validation_data is not None
            else 0,
            checkpoint_every=every if opts.checkpoint_path is not None else 0,
            plot_every=max(1, steps // 4) if opts.plots != "none" else 0)

    def _progress(self) -> Progress:
        """The table, sinks and ``output_fn`` on process 0; other processes only record."""
        main = self.parallel.is_main_process
        if not (self.options.verbose and main):
            return Progress(self.history, sinks=self._sinks() if main else (),
                            output_fn=self.options.output_fn if main else None)
        bar = TrainingBar(self.history, self.total)
        table = VerboseTable(self.history, self.options.verbose_frequency,  # above the bar
                             writing=bar.writing if bar.shown else None)
        return Progress(self.history, table=table, bar=bar, sinks=self._sinks(),
                        output_fn=self.options.output_fn)

    def _sinks(self) -> list:
        """What follows the run besides the table: the training-progress view, TensorBoard."""
        opts, sinks = self.options, []
        if opts.plots == "training-progress":
            from jaxflowers.plots.training_progress import TrainingProgressPlot
            kinds = "/".join(sorted({d.device_kind for d in self.parallel.devices}))
            sinks.append(TrainingProgressPlot(
                path=opts.plots_path, max_epochs=opts.max_epochs,
                iterations_per_epoch=self.program.feed.steps_per_epoch,
                hardware=f"{self.parallel.num_devices} x {kinds}", metrics=opts.metrics,
                validation_frequency=(opts.validation_frequency
                                      if opts.validation_data is not None else None)))
        if opts.log_dir is not None:
            from jaxflowers.training.tensorboard import TensorBoardLog
            sinks.append(TensorBoardLog(opts.log_dir))
        return sinks

    def _summary(self) -> str:
        """One line saying what runs where, in plain words."""
        parallel, program, opts = self.parallel, self.program, self.options
        kinds = "/".join(sorted({d.device_kind for d in parallel.devices}))
        count = parallel.num_devices
        where = f"{count} {kinds} device{'s' if count > 1 else ''}"
        if parallel.multiprocess:
            where += f" in {parallel.process_count} processes"
        placement = ("copied to every device" if program.feed.kind == "resident"
                     else "streamed from the host")
        resumed = f", resuming at iteration {self.start}" if self.start else ""
        return (f"Training on {where} ({np.dtype(program.dtype).name}, {parallel.strategy}): "
                f"{len(self.data)} images {placement}, mini-batch {opts.mini_batch_size} "
                f"({opts.mini_batch_size // count} per device), "
                f"{program.feed.steps_per_epoch} iterations per epoch{resumed}")


def _execution(execution) -> ExecutionOptions:
    if execution is None:
        return ExecutionOptions()
    if isinstance(execution, dict):
        return ExecutionOptions(**execution)
    if not isinstance(execution, ExecutionOptions):
        raise TypeError(f"execution must be ExecutionOptions, a dict of its fields or None, "
                        f"not {type(execution).__name__}")
    return execution


def _feed(data, options: TrainingOptions, execution: ExecutionOptions, parallel: DataParallel):
    """``ResidentData`` or ``StreamedData``; process 0's choice (different feeds would hang)."""
    placement = choose_placement(execution.data_placement, data, parallel.local_devices)
    streamed = bool(parallel.from_main_process(np.int32(placement.kind == "stream")))
    plan = dict(mini_batch_size=options.mini_batch_size, num_epochs=options.max_epochs,
                shuffle=options.shuffle, seed=options.seed)
    if not streamed:
        return ResidentData(data, **plan)
    from jaxflowers.data.stream import StreamedData  # grain loads only when streaming
    return StreamedData(data, multiprocess=parallel.multiprocess, **plan)


def _look_ahead(options: TrainingOptions, parallel: DataParallel) -> int:
    """Sync points by which the host reads results late (1: the devices run on meanwhile)."""
    # 0 with output_fn (it may stop on what it sees) and on CPUs (nothing to overlap).
    cpu = parallel.devices[0].platform == "cpu"
    return 0 if options.output_fn is not None or cpu else 1


def _check_batch(options: TrainingOptions, num_devices: int, num_samples: int) -> None:
    batch = options.mini_batch_size
    if batch % num_devices:
        raise ValueError(f"mini_batch_size={batch} is not divisible by {num_devices} devices; "
                         f"use a multiple of {num_devices} or scale_for_devices")
    if batch > num_samples:
        raise ValueError(f"mini_batch_size={batch} is larger than the {num_samples} training "
                         "images, so an epoch would have no complete mini-batch")
