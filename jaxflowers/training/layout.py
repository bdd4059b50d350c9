"""The update's parameter layout: the model's tree, or one float32 vector (``FlatParams``).

Same arithmetic as the tree up to XLA's summation order; nothing outside the program sees it.
The vector holds each convolution kernel (HWIO in the tree) output channels first (OHWI), the
order cuDNN's filter gradient comes out in, so raveling a step's gradients moves no data.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FlatParams", "Layout", "flat_layout"]


@dataclasses.dataclass(frozen=True)
class FlatParams:
    """Where each leaf of a tree lives in one float32 vector."""

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]  # the leaves' shapes
    offsets: tuple[int, ...]  # len(shapes) + 1 offsets; the last is the vector's length
    stats: "FlatParams | None" = None  # the batch-norm statistics' vector layout, or None

    @staticmethod
    def _to_stored(leaf):
        """A leaf as the vector holds it: 4-D kernels HWIO -> OHWI, others as they are."""
        return leaf.transpose(3, 0, 1, 2) if leaf.ndim == 4 else leaf

    @staticmethod
    def _stored_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[3], *shape[:3]) if len(shape) == 4 else shape

    @classmethod
    def of(cls, tree, stats=None) -> "FlatParams":
        """The layout of a tree of arrays or shapes (and of ``stats``, if it has leaves)."""
        leaves, treedef = jax.tree.flatten(tree)
        shapes = tuple(tuple(leaf.shape) for leaf in leaves)
        sizes = [int(np.prod(shape)) for shape in shapes]
        inner = cls.of(stats) if stats is not None and jax.tree.leaves(stats) else None
        return cls(treedef, shapes, tuple(np.cumsum([0] + sizes).tolist()), inner)

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def ravel(self, tree, xp=jnp):
        """The leaves raveled and concatenated as float32 (``xp``: jax.numpy or numpy)."""
        return xp.concatenate([xp.ravel(self._to_stored(xp.asarray(leaf))).astype(xp.float32)
                               for leaf in jax.tree.leaves(tree)])

    def unravel(self, flat):
        """The tree of a vector (jax or numpy); leading axes (pmap's device axis) are kept."""
        lead = tuple(flat.shape[:-1])
        leaves = [self._from_stored(flat[..., start:stop].reshape(
            lead + self._stored_shape(shape)), len(lead)) for start, stop, shape in
                  zip(self.offsets[:-1], self.offsets[1:], self.shapes)]
        return jax.tree.unflatten(self.treedef, leaves)

    @staticmethod
    def _from_stored(leaf, lead: int):
        """A stored leaf (after ``lead`` leading axes) in the tree's order: OHWI -> HWIO."""
        if leaf.ndim - lead != 4:
            return leaf
        return leaf.transpose(*range(lead), lead + 1, lead + 2, lead + 3, lead)

    def unpack(self, variables: dict) -> dict:
        """``{"params", "batch_stats"}`` with their vectors unravelled into trees."""
        unpacked = {**variables, "params": self.unravel(variables["params"])}
        if self.stats is not None:
            unpacked["batch_stats"] = self.stats.unravel(variables["batch_stats"])
        return unpacked

    def stats_tree(self, batch_stats):
        """The batch-norm statistics as the model's tree, however they are stored."""
        return batch_stats if self.stats is None else self.stats.unravel(batch_stats)

    def stats_stored(self, tree, xp=jnp):
        """The batch-norm statistics' tree as this layout stores them."""
        return tree if self.stats is None else self.stats.ravel(tree, xp)

    def is_vector(self, leaf) -> bool:
        """Whether ``leaf`` is a whole parameter vector (a solver's per-parameter state)."""
        return getattr(leaf, "shape", None) == (self.size,)


def flat_layout(variable_shapes: dict) -> FlatParams:
    """The one-vector layout of a model's ``{"params", "batch_stats"}`` shapes."""
    return FlatParams.of(variable_shapes["params"], variable_shapes.get("batch_stats"))


class Layout:
    """Conversions between a ``TrainState`` as the update keeps it (``flat``, or None for a
    tree) and the model's tree; ``tx`` is the optimizer."""

    def __init__(self, flat: FlatParams | None, tx):
        self.flat, self.tx = flat, tx

    def variables(self, stored: dict) -> dict:
        """``{"params", "batch_stats"}`` as the model's tree (inside a program, or numpy)."""
        return stored if self.flat is None else self.flat.unpack(stored)

    def copy_variables(self, stored: dict) -> dict:
        """A copy of the stored variables as the model's tree (per device, in a program)."""
        return jax.tree.map(jnp.copy, self.variables(stored))

    def to_tree(self, state) -> dict:
        """``state`` as a dict in tree form, every leaf a copy (per device, in a program)."""
        params, opt_state, batch_stats = state.params, state.opt_state, state.batch_stats
        if self.flat is not None:
            params, batch_stats = self.flat.unravel(params), self.flat.stats_tree(batch_stats)
            opt_state = jax.tree.map(lambda leaf: self.flat.unravel(leaf)
                                     if self.flat.is_vector(leaf) else leaf, opt_state)
        tree = {"step": state.step, "params": params, "batch_stats": batch_stats,
                "opt_state": opt_state, "key": state.key, "halted": state.halted}
        return jax.tree.map(jnp.copy, tree)

    def from_tree(self, tree: dict, state_type):
        """A host ``state_type`` in this layout from ``to_tree``'s form (numpy arrays)."""
        tree = jax.tree.map(np.asarray, tree)
        params, opt_state, batch_stats = tree["params"], tree["opt_state"], tree["batch_stats"]
        if self.flat is not None:
            # The flat solver state holds one vector where the tree form holds a parameter
            # tree: cut the tree form at the flat state's leaves and ravel those subtrees.
            ravel = functools.partial(self.flat.ravel, xp=np)
            flat_opt = jax.eval_shape(self.tx.init, jax.ShapeDtypeStruct((self.flat.size,),
                                                                         jnp.float32))
            treedef = jax.tree.structure(flat_opt)
            opt_state = jax.tree.unflatten(treedef, [
                ravel(part) if self.flat.is_vector(shape) else np.asarray(part)
                for part, shape in zip(treedef.flatten_up_to(opt_state),
                                       jax.tree.leaves(flat_opt))])
            params, batch_stats = ravel(params), self.flat.stats_stored(batch_stats, np)
        return state_type(step=tree["step"], params=params, batch_stats=batch_stats,
                          opt_state=opt_state, key=tree["key"], halted=tree["halted"])
