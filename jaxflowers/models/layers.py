"""``nn.Conv`` and ``nn.Dense`` whose parameters cost nothing to look up when applied.

flax's ``Module.param`` checks, on every ``apply``, that a stored parameter has the shape
its initialiser would give, by tracing the initialiser (``jax.eval_shape`` of a draw from
``random.key(0)``) for each of ResNet-50's 161 parameters, on the main thread before
anything can compile or run: a sizeable share of a warm start (``benchmarks/NOTES.md``,
"Compile time"). :func:`param` makes the same check from the shape argument itself, which
is what the initialiser would have been asked for.

Same classes, attributes, variable names, initial values (the same ``params`` key
sequence) and computation as flax's, so models and checkpoints are interchangeable.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import errors
from flax.core import meta


def param(module: nn.Module, name: str, init_fn: Callable, shape, dtype: Any = jnp.float32):
    """``module.param(name, init_fn, shape, dtype)`` without tracing ``init_fn`` on apply.

    Creates the parameter from ``init_fn(key, shape, dtype)`` with the module's next
    ``params`` key when initialising; otherwise returns the stored value after checking
    that its shape is ``shape`` (``flax.errors.ScopeParamShapeError`` if not, as flax).
    """
    variable = module.variable("params", name,
                               lambda: init_fn(module.make_rng("params"), shape, dtype))
    value = meta.unbox(variable.value)
    if np.shape(value) != tuple(shape):
        raise errors.ScopeParamShapeError(name, module.scope.path_text, np.shape(value),
                                          tuple(shape))
    return value


class _DirectParams:
    """Mixin: ``self.param(name, init_fn, shape, dtype)`` goes through :func:`param`.

    flax's layers call ``self.param`` with exactly (shape, dtype) after the initialiser."""

    def param(self, name, init_fn, shape, dtype=jnp.float32):
        return param(self, name, init_fn, shape, dtype)


class Conv(_DirectParams, nn.Conv):
    """``flax.linen.Conv`` (same attributes), without the per-apply initialiser trace."""


class Dense(_DirectParams, nn.Dense):
    """``flax.linen.Dense`` (same attributes), without the per-apply initialiser trace."""
