"""Batch-norm population statistics: one pass over the training data after training.

MATLAB's ``trainingOptions(BatchNormalizationStatistics="population")``, its default:
once training ends, the running averages of every batch-norm layer are replaced by the
mean and variance of that layer's inputs over the whole training set, computed with the
final weights. The running averages lag behind weights that still move (they average the
last ~10 mini-batches of a network that changed along the way); the population figures
describe the network that is returned.

:func:`batch_moments` is the per-device piece (pure, jit- and shard_map-friendly);
:func:`population_statistics` runs it over a data set on one device and returns the
network with the new statistics; :func:`resident_pass` is the pass ``train`` runs at the end
of training on every device (``TrainingOptions(batch_normalization_statistics=
"population")``, the default), defined exactly as follows:

* It reads the training set in its stored order, in whole global mini-batches of
  ``mini_batch_size`` (the last partial one left out, as a training epoch does), through the
  training augmentation, image ``i`` with the key ``random.split(PRNGKey(seed), n)[i]``
  (``n`` the images of the pass, ``seed`` the options').
* The network runs in training mode: every batch-norm layer normalises with the statistics
  of the current mini-batch, pooled over the whole global batch on every device
  (synchronised batch norm, for models with a ``bn_axis_name``), so every layer sees what
  it would see on one device given the whole mini-batch.
* Each layer's mean is the mean of its float32 inputs over every image and position of the
  pass, its variance the mean of squares minus the squared mean: the exact moments of what
  the layer saw (not an average of per-batch variances).

So on any number of devices it gives ``population_statistics(net, data, mini_batch_size=
mini_batch_size, augmentation=augmentation, seed=seed)`` of the pass's images.
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

_NORMS = (BatchNorm, nn.BatchNorm)
_COLLECTION = "population_moments"


def _record_moments(next_fun, args, kwargs, context):
    """Interceptor: before a batch-norm layer runs, sow the per-channel float32 mean and
    mean square of its input (over every axis but the last), as the layer sees it."""
    module = context.module
    if isinstance(module, _NORMS) and context.method_name == "__call__":
        x = jnp.asarray(args[0], getattr(module, "dtype", None) or args[0].dtype)
        xf = x.astype(jnp.float32)
        axes = tuple(range(x.ndim - 1))
        module.sow(_COLLECTION, "moments", jnp.stack([xf.mean(axes), jnp.square(xf).mean(axes)]))
    return next_fun(*args, **kwargs)


def batch_moments(model, variables: dict, x: jax.Array, frozen: frozenset = frozenset()) -> dict:
    """Per batch-norm layer, the float32 (2, C) first and second moments of its input.

    The forward pass runs in training mode (each layer normalises with its batch's
    statistics, as during training), so the moments are those the layers saw in training.

    Args:
      model: a flax module taking ``train=``; its ``BatchNorm`` layers (jaxflowers' or
        ``flax.linen``'s) are each called once per forward pass.
      variables: ``{"params": ..., "batch_stats": ...}`` (trees, not flat vectors).
      x: (B, H, W, C) normalised inputs in the model's compute dtype.
      frozen: module paths of frozen batch-norm layers, which normalise with their stored
        statistics (as in training; ``learn_rates.frozen_layers``).

    Returns:
      A tree shaped like ``variables["batch_stats"]`` whose leaves' parents hold
      ``"moments"``: ``{"BatchNorm_0": {"moments": (2, C)}, ...}``. Average it over
      batches (and ``pmean`` it over devices) before :func:`moments_to_statistics`.
    """
    with nn.intercept_methods(_record_moments), frozen_layers(frozen):
        _, state = model.apply(variables, x, train=True,
                               mutable=["batch_stats", _COLLECTION])
    return jax.tree.map(lambda sown: sown[0], state[_COLLECTION],
                        is_leaf=lambda v: isinstance(v, tuple))


def moments_to_statistics(moments: dict) -> dict:
    """``{"mean", "var"}`` per layer from averaged :func:`batch_moments` (population
    variance ``E[x^2] - E[x]^2``, clipped at 0)."""
    def convert(node):
        if "moments" in node:
            first, second = node["moments"][0], node["moments"][1]
            return {"mean": first, "var": jnp.maximum(second - jnp.square(first), 0.0)}
        return {name: convert(child) for name, child in node.items()}
    return convert(moments)


def population_statistics(net, data, *, mini_batch_size: int = 128,
                          augmentation: Augmentation | None = None, seed: int = 0):
    """The network with its batch-norm statistics recomputed over ``data`` (one pass).

    MATLAB: ``trainingOptions(BatchNormalizationStatistics="population")``, which
    finalises the statistics after training by passing through the training data once.

    Args:
      net: a ``TrainedNet`` (from ``train``).
      data: the training set: an image set or a uint8 (N, H, W, C) array of the images
        ``net`` expects.
      mini_batch_size: images per forward pass; every image counts once (the last,
        smaller batch too), each batch weighted by its size.
      augmentation: applied to the images first, as MATLAB's pass reads an augmented
        datastore; None reads them as they are.
      seed: the augmentation's randomness.

    Returns:
      A new ``TrainedNet`` whose ``variables["batch_stats"]`` hold the population mean
      and variance of every batch-norm layer; parameters unchanged.

    Raises:
      ValueError: ``data`` is not uint8 images of ``net.input_shape``, or
        ``mini_batch_size`` is not a positive integer.
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

    Args:
      variables: {"params", "batch_stats"} in tree form, replicated.
      images: (N, H, W, C) uint8, the whole training set on this device.
      order: (batches, b) int32, this device's columns of each global mini-batch.
      stats: per-channel input (mean, std), float32 (C,) each.
      seed: uint32 scalar, the run's seed (an argument: one program serves every seed).
      model: the module with batch norm pooled over the mesh axis.
      augmentation, count: the pass's augmentation and its image count.
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
    """Per device: :func:`batch_moments` of this device's rows of a global mini-batch
    (uint8, augmented with ``keys``), averaged over the devices (equal rows on each, so the
    mean of their means is the global batch's)."""
    if augmentation is not None:
        images = augmentation(images, keys)
    moments = batch_moments(model, variables, normalize(images, stats[0], stats[1], dtype),
                            frozen)
    return jax.lax.pmean(moments, AXIS)


def with_population(variables: dict, total: dict, batches: int,
                    frozen: frozenset = frozenset()) -> dict:
    """``variables`` whose batch-norm statistics come from ``total``, the summed
    :func:`batch_moments` of ``batches`` equal-sized mini-batches (the ``frozen`` layers'
    kept as they are)."""
    statistics = moments_to_statistics(jax.tree.map(lambda t: t / batches, total))
    statistics = keep_frozen_stats(statistics, variables["batch_stats"], frozen)
    return {**variables, "batch_stats": statistics}


# ---------------------------------------------------------------- the pass of a training run

def compile_pass(program):
    """The compiled population pass of a ``TrainProgram``'s feed: ``run(variables, *,
    arrays, stats)`` returns placed variables with population statistics."""
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
    """The population pass over a streamed training set: one dispatch per host batch, each
    image with the key ``resident_pass`` gives it."""

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
