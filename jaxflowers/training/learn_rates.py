"""Per-parameter learning-rate factors and frozen layers (MATLAB's ``setLearnRateFactor``,
``freezeNetwork``), from ``TrainingOptions.learn_rate_factors``.

A parameter's path is its keys in the params tree joined by "/" (``head/kernel``,
``BottleneckBlock_3/Conv_1/kernel``). A pattern (``fnmatch`` glob, ``*`` crossing "/")
applies to a parameter when it matches the path or a leading part of it ending at a "/"
(so ``head`` means both of the head's parameters); later patterns win over earlier ones,
as later ``setLearnRateFactor`` calls do, and a pattern that matches nothing is an error.

The factor multiplies the solver's update (the rate times the factor, MATLAB's meaning for
every solver). Factor 0 freezes: no gradient is computed for the parameter and it stays
bit-identical. A batch-norm layer whose scale and offset are both frozen is frozen as a
layer: it normalises with its stored statistics in training too and they never change
(also not in the population pass). On the one-vector layout the factors are runs of the
vector (``FlatParams`` offsets), each run's updates multiplied by one scalar, so the
program holds no per-element constant and the all-reduce is the same.
"""
from __future__ import annotations

import contextlib
import fnmatch
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxflowers.models.norm import BatchNorm

__all__ = ["factors", "frozen_layers", "frozen_norms", "keep_frozen_stats", "paths",
           "scale_updates", "stop_frozen"]


def paths(tree) -> list[str]:
    """The "/"-joined key paths of ``tree``'s leaves, in leaf order."""
    return ["/".join(str(getattr(k, "key", k)) for k in keys)
            for keys, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _applies(pattern: str, path: str) -> bool:
    parts = path.split("/")
    return any(fnmatch.fnmatchcase("/".join(parts[:n]), pattern)
               for n in range(1, len(parts) + 1))


def factors(patterns: Sequence[tuple[str, float]], params) -> list[float] | None:
    """One factor per leaf of ``params`` (leaf order), or None when every factor is 1.

    Raises:
      ValueError: a pattern matches no parameter; the message lists the top-level names.
    """
    if not patterns:
        return None
    names = paths(params)
    result = [1.0] * len(names)
    for pattern, factor in patterns:
        hits = [i for i, name in enumerate(names) if _applies(pattern, name)]
        if not hits:
            tops = ", ".join(dict.fromkeys(name.split("/")[0] for name in names))
            raise ValueError(f"learn_rate_factors: {pattern!r} matches no parameter; the "
                             f"network's layers are {tops}")
        for i in hits:
            result[i] = float(factor)
    return None if all(f == 1.0 for f in result) else result


def frozen_norms(leaf_factors: list[float] | None, params, batch_stats) -> frozenset:
    """Module paths (tuples) of the batch-norm layers whose parameters are all frozen."""
    if leaf_factors is None:
        return frozenset()
    frozen: dict[tuple, bool] = {}
    for name, factor in zip(paths(params), leaf_factors):
        module = tuple(name.split("/")[:-1])
        frozen[module] = frozen.get(module, True) and factor == 0.0
    stats = {tuple(name.split("/")[:-1]) for name in paths(batch_stats)}
    return frozenset(m for m, is_frozen in frozen.items() if is_frozen and m in stats)


def scale_updates(leaf_factors: list[float] | None, layout=None) -> optax.GradientTransformation:
    """Multiply each parameter's update by its factor (per leaf, or per run of the flat
    vector when ``layout`` is a ``FlatParams``)."""
    def update(updates, state, params=None):
        del params
        if layout is None:
            leaves, treedef = jax.tree.flatten(updates)
            scaled = [u if f == 1.0 else (jnp.zeros_like(u) if f == 0.0 else u * f)
                      for u, f in zip(leaves, leaf_factors)]
            return jax.tree.unflatten(treedef, scaled), state
        return _scale_runs(updates, _runs(layout.offsets, leaf_factors)), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _runs(offsets, values) -> list[tuple[int, int, float]]:
    """Contiguous ``(start, stop, value)`` runs of a per-leaf value over a flat vector."""
    runs: list[list] = []
    for start, stop, value in zip(offsets[:-1], offsets[1:], values):
        if runs and runs[-1][2] == value:
            runs[-1][1] = stop
        else:
            runs.append([start, stop, value])
    return [tuple(run) for run in runs]


def _scale_runs(vector, runs):
    parts = [vector[a:b] if f == 1.0 else (jnp.zeros((b - a,), vector.dtype) if f == 0.0
                                           else vector[a:b] * f) for a, b, f in runs]
    return jnp.concatenate(parts)


def stop_frozen(params, leaf_factors: list[float] | None):
    """``params`` with no gradient through the frozen leaves (XLA then skips computing it)."""
    if leaf_factors is None or 0.0 not in leaf_factors:
        return params
    leaves, treedef = jax.tree.flatten(params)
    return jax.tree.unflatten(treedef, [jax.lax.stop_gradient(p) if f == 0.0 else p
                                        for p, f in zip(leaves, leaf_factors)])


def keep_frozen_stats(new, old, frozen: frozenset, layout=None):
    """``new`` batch-norm statistics with the frozen layers' taken from ``old`` (exactly:
    an all-reduce of equal values may round), as a tree or a flat vector (``layout``)."""
    if not frozen:
        return new
    if layout is None:
        return jax.tree_util.tree_map_with_path(
            lambda keys, n, o: o if _module(keys) in frozen else n, new, old)
    shapes = jax.tree.unflatten(layout.treedef, list(range(len(layout.shapes))))
    keep = [_module(keys) in frozen for keys, _ in jax.tree_util.tree_leaves_with_path(shapes)]
    runs = _runs(layout.offsets, keep)
    return jnp.concatenate([old[a:b] if k else new[a:b] for a, b, k in runs])


def _module(keys) -> tuple:
    return tuple(str(getattr(k, "key", k)) for k in keys[:-1])


@contextlib.contextmanager
def frozen_layers(frozen: frozenset):
    """Within: the batch-norm layers at the ``frozen`` paths run with their stored
    statistics (``use_running_average=True``), also in training mode."""
    if not frozen:
        yield
        return

    def use_stored(next_fun, args, kwargs, context):
        module = context.module
        if (isinstance(module, (BatchNorm, nn.BatchNorm)) and context.method_name == "__call__"
                and tuple(module.scope.path) in frozen):
            kwargs = {**kwargs, "use_running_average": True}
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(use_stored):
        yield
