"""Batch-norm population statistics (MATLAB's ``BatchNormalizationStatistics="population"``).

Each layer's statistics become the exact moments of its inputs over one pass of the training set
with the final weights. Invariant: ``train``'s pass (:func:`resident_pass`) gives on any device
count what :func:`population_statistics` gives on one (stored order, whole global batches, image
``i`` keyed ``split(PRNGKey(seed), n)[i]``, batch norm pooled over devices).
"""
from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxflowers.data.augment import Augmentation, normalize
from jaxflowers.models.norm import BatchNorm
from jaxflowers.parallel.data_parallel import AXIS
from jaxflowers.training.learn_rates import frozen_layers, keep_frozen_stats

__all__ = ["batch_moments", "compile_pass", "moments_to_statistics", "pass_moments",
           "population_statistics", "resident_pass", "with_population"]

_NORMS = (BatchNorm, nn.BatchNorm)
_COLLECTION = "population_moments"


def _record_moments(next_fun, args, kwargs, context):
    """Interceptor: sow each batch-norm input's per-channel float32 mean and mean square."""
    module = context.module
    if isinstance(module, _NORMS) and context.method_name == "__call__":
        x = jnp.asarray(args[0], getattr(module, "dtype", None) or args[0].dtype)
        channels = getattr(module, "channels", None)  # zero channels beyond it: not stored
        xf = x.astype(jnp.float32)[..., :channels]
        axes = tuple(range(x.ndim - 1))
        module.sow(_COLLECTION, "moments", jnp.stack([xf.mean(axes), jnp.square(xf).mean(axes)]))
    return next_fun(*args, **kwargs)


def batch_moments(model, variables: dict, x: jax.Array, frozen: frozenset = frozenset()) -> dict:
    """Per batch-norm layer, the float32 (2, C) first and second moments of its input.

    Args:
      model: a flax module taking ``train=`` (run in training mode).
      variables: ``{"params": ..., "batch_stats": ...}`` in tree form.
      x: (B, H, W, C) normalised inputs in the model's compute dtype.
      frozen: module paths of frozen batch-norm layers, which normalise with their stored
        statistics (as in training; ``learn_rates.frozen_layers``).

    Returns:
      ``{"BatchNorm_0": {"moments": (2, C)}, ...}``; average before ``moments_to_statistics``.
    """
    with nn.intercept_methods(_record_moments), frozen_layers(frozen):
        _, state = model.apply(variables, x, train=True,
                               mutable=["batch_stats", _COLLECTION])
    return jax.tree.map(lambda sown: sown[0], state[_COLLECTION],
                        is_leaf=lambda v: isinstance(v, tuple))


def moments_to_statistics(moments: dict) -> dict:
    """``{"mean", "var"}`` per layer from averaged :func:`batch_moments` (var clipped at 0)."""
    def convert(node):
        if "moments" in node:
            first, second = node["moments"][0], node["moments"][1]
            return {"mean": first, "var": jnp.maximum(second - jnp.square(first), 0.0)}
        return {name: convert(child) for name, child in node.items()}
    return convert(moments)


def population_statistics(net, data, *, mini_batch_size: int = 128,
                          augmentation: Augmentation | None = None, seed: int = 0):
    """The network with batch-norm statistics recomputed over ``data`` (MATLAB's "population").

    Args:
      net: a ``TrainedNet``.
      data: an image set or uint8 (N, H, W, C) images of ``net.input_shape``.
      mini_batch_size: images per forward pass (every image counts once).
      augmentation: applied to the images first; None: none.
      seed: the augmentation's randomness.

    Returns:
      A new ``TrainedNet`` with population mean and variance in ``variables["batch_stats"]``.

    Raises:
      ValueError: ``data`` is not such images, or ``mini_batch_size`` not a positive integer.
    """
    images = np.asarray(getattr(data, "images", data))
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != tuple(
            net.input_shape) or len(images) == 0:
        raise ValueError(f"population_statistics: data must be uint8 images (n, "
                         f"{', '.join(map(str, net.input_shape))}), n >= 1; got "
                         f"{images.dtype} {images.shape}")
    if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int) \
            or mini_batch_size < 1:
        raise ValueError(f"population_statistics: mini_batch_size={mini_batch_size!r} must be "
                         "a positive integer")
    variables = jax.device_put(net.variables)
    stats = tuple(jnp.asarray(s, jnp.float32) for s in net.normalization)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(images))
    total, count = None, 0
    for start in range(0, len(images), mini_batch_size):
        batch = images[start:start + mini_batch_size]
        moments = _weighted_moments(net.model, variables, jnp.asarray(batch), stats,
                                    keys[start:start + len(batch)], augmentation, net.dtype)
        total = moments if total is None else jax.tree.map(jnp.add, total, moments)
        count += len(batch)
    mean_moments = jax.tree.map(lambda t: np.asarray(t) / count, total)
    batch_stats = jax.tree.map(np.asarray, moments_to_statistics(mean_moments))
    return dataclasses.replace(net, variables={**net.variables, "batch_stats": batch_stats})


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _weighted_moments(model, variables, images, stats, keys, augmentation, dtype):
    """``batch_moments`` of one uint8 batch, times its size (so batches sum to totals)."""
    if augmentation is not None:
        images = augmentation(images, keys)
    moments = batch_moments(model, variables, normalize(images, stats[0], stats[1], dtype))
    return jax.tree.map(lambda m: m * images.shape[0], moments)


def resident_pass(variables, images, order, stats, seed, *, model, dtype, augmentation,
                  count: int, frozen: frozenset = frozenset()) -> dict:
    """Per device: ``variables`` with population statistics from the resident training set.

    ``images`` (N, H, W, C) uint8 is the whole set, ``order`` (batches, b) int32 this device's
    columns of each global batch, ``seed`` a uint32 scalar (one program serves every seed),
    ``model`` pools batch norm over the mesh axis.
    """
    keys = jax.random.split(jax.random.PRNGKey(seed), count)

    def add(total, rows):
        moments = pass_moments(variables, jnp.take(images, rows, axis=0), stats,
                               keys=jnp.take(keys, rows, axis=0), model=model, dtype=dtype,
                               augmentation=augmentation, frozen=frozen)
        return jax.tree.map(jnp.add, total, moments), None

    first = pass_moments(variables, jnp.take(images, order[0], axis=0), stats,
                         keys=jnp.take(keys, order[0], axis=0), model=model, dtype=dtype,
                         augmentation=augmentation, frozen=frozen)
    total, _ = jax.lax.scan(add, first, order[1:])
    return with_population(variables, total, order.shape[0], frozen)


def pass_moments(variables, images, stats, *, keys, model, dtype, augmentation,
                 frozen: frozenset = frozenset()) -> dict:
    """Per device: :func:`batch_moments` of this device's rows of a global mini-batch."""
    if augmentation is not None:
        images = augmentation(images, keys)
    moments = batch_moments(model, variables, normalize(images, stats[0], stats[1], dtype),
                            frozen)
    # Mean over devices: equal rows on each, so the mean of their means is the global batch's.
    return jax.lax.pmean(moments, AXIS)


def with_population(variables: dict, total: dict, batches: int,
                    frozen: frozenset = frozenset()) -> dict:
    """``variables`` with statistics from ``total``, summed moments of ``batches`` batches
    (the ``frozen`` layers' kept)."""
    statistics = moments_to_statistics(jax.tree.map(lambda t: t / batches, total))
    statistics = keep_frozen_stats(statistics, variables["batch_stats"], frozen)
    return {**variables, "batch_stats": statistics}


# ---------------------------------------------------------------- the pass of a training run

def compile_pass(program):
    """The compiled pass for a ``TrainProgram``: ``(variables, arrays, stats) -> variables``."""
    import functools

    from jaxflowers.data.feed import ResidentData
    from jaxflowers.parallel.data_parallel import REPLICATED, sharded

    parallel, options, feed = program.parallel, program.options, program.feed
    kwargs = dict(model=program.population_model, dtype=program.dtype,
                  augmentation=options.augmentation, frozen=program.frozen)
    batches = feed.steps_per_epoch
    order = np.arange(batches * options.mini_batch_size, dtype=np.int32).reshape(batches, -1)
    if not isinstance(feed, ResidentData):
        return _StreamedPopulation(program, kwargs, order)
    fn = functools.partial(resident_pass, count=order.size, **kwargs)
    wrapped = parallel.wrap(fn, (REPLICATED, REPLICATED, sharded(1), REPLICATED, REPLICATED),
                            REPLICATED)
    images = parallel.abstract(jax.ShapeDtypeStruct(feed.shape, np.uint8))
    placed = parallel.abstract(jax.ShapeDtypeStruct(order.shape, np.int32), sharded(1))
    seed = parallel.abstract(jax.ShapeDtypeStruct((), np.uint32))
    compiled = wrapped.lower(program.variable_shapes(), images, placed, program.stats_shape,
                             seed).compile()
    return lambda variables, arrays, stats: compiled(
        variables, arrays[0], parallel.put(order, sharded(1)), stats,
        parallel.put(np.uint32(options.seed)))


class _StreamedPopulation:
    """The pass over a streamed training set: one dispatch per host batch, keys as resident."""

    def __init__(self, program, kwargs: dict, order: np.ndarray):
        import functools

        from jaxflowers.parallel.data_parallel import REPLICATED, sharded

        self.program, self.order = program, order
        parallel = program.parallel

        def add(total, variables, images, keys, stats):
            moments = pass_moments(variables, images, stats, keys=keys, **kwargs)
            return jax.tree.map(jnp.add, total, moments)

        self._add = parallel.wrap(add, (REPLICATED, REPLICATED, sharded(0), sharded(0),
                                        REPLICATED), REPLICATED, donate_argnums=(0,))
        self._finish = parallel.wrap(functools.partial(with_population, batches=len(order),
                                                       frozen=kwargs["frozen"]),
                                     (REPLICATED, REPLICATED), REPLICATED)

    def __call__(self, variables, arrays, stats):
        del arrays  # the training iterator: the pass reads the set in its own order
        from jaxflowers.data.stream import host_batches, process_columns
        from jaxflowers.parallel.data_parallel import sharded

        program, parallel, order = self.program, self.program.parallel, self.order
        keys = np.asarray(jax.random.split(jax.random.PRNGKey(program.options.seed),
                                           order.size))
        if parallel.multiprocess:
            order = process_columns(order, jax.process_index(), jax.process_count())
        shapes = jax.eval_shape(functools.partial(batch_moments, program.model),
                                program.variable_shapes_local(),
                                jax.ShapeDtypeStruct((1, *program.input_shape), program.dtype))
        total = parallel.put(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))
        for batch in host_batches(program.feed.data, order):
            images, batch_keys = parallel.put_process_local(
                (batch["images"], keys[batch["index"]]), sharded(0))
            total = self._add(total, variables, images, batch_keys, stats)
        return self._finish(variables, total)
