"""``nn.Conv`` and ``nn.Dense`` whose parameters cost nothing to look up when applied.

flax's ``Module.param`` traces every initialiser on every ``apply`` to check the stored shape;
:func:`param` checks against the shape argument. Names, initial values and outputs are flax's.
``Conv`` can also compute on more channels than it stores (zeros), which tensor cores want.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import errors
from flax.core import meta

__all__ = ["Conv", "Dense", "param"]


def param(module: nn.Module, name: str, init_fn: Callable, shape, dtype: Any = jnp.float32):
    """``module.param(name, init_fn, shape, dtype)`` without tracing ``init_fn`` on apply."""
    variable = module.variable("params", name,
                               lambda: init_fn(module.make_rng("params"), shape, dtype))
    value = meta.unbox(variable.value)
    if np.shape(value) != tuple(shape):
        raise errors.ScopeParamShapeError(name, module.scope.path_text, np.shape(value),
                                          tuple(shape))
    return value


class _DirectParams:
    """Mixin: ``self.param(name, init_fn, shape, dtype)`` goes through :func:`param`."""

    def param(self, name, init_fn, shape, dtype=jnp.float32):
        return param(self, name, init_fn, shape, dtype)


class Conv(_DirectParams, nn.Conv):
    """``flax.linen.Conv`` (same attributes), without the per-apply initialiser trace.

    Attributes (besides flax's):
      stored_features: ``(in, out)`` channels of the stored kernel and bias when the layer
        computes on more (its input's channels and ``features``): the kernel and bias are
        zero-padded on the fly, so the stored outputs are unchanged and the extra ones are
        zero. None: store what it computes, as flax does.
    """

    stored_features: tuple[int, int] | None = None
    fold_bias: bool = False  # the output leaves the bias out: see folded_bias

    def param(self, name, init_fn, shape, dtype=jnp.float32):
        if self.stored_features is None:
            value = param(self, name, init_fn, shape, dtype)
        else:
            stored = (*shape[:-2], *self.stored_features) if name == "kernel" else (
                *shape[:-1], self.stored_features[1])
            value = jnp.pad(param(self, name, init_fn, stored, dtype),
                            [(0, want - have) for want, have in zip(shape, stored)])
        if name == "bias" and self.fold_bias:
            return jnp.zeros_like(value)  # a constant zero, which XLA drops from the sum
        return value

    def folded_bias(self):
        """The bias a ``fold_bias`` layer left out of its output (after it was called), as it
        computes it (zero-padded like the kernel). Batch norm right after the convolution
        takes it as its ``offset``: no pass adds it and no reduction makes its gradient."""
        value = self.variables["params"]["bias"]
        if self.stored_features is not None:
            value = jnp.pad(value, (0, self.features - self.stored_features[1]))
        return value


class Dense(_DirectParams, nn.Dense):
    """``flax.linen.Dense`` (same attributes), without the per-apply initialiser trace."""
