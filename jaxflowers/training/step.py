"""The pure per-device training step and the block of steps one dispatch runs.

They know only the mesh axis name. A step whose loss or gradient is not finite changes nothing
and sets ``TrainState.halted``; later steps are skipped, and the host learns of it from the
metrics it reads anyway.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxflowers.compilation.options import compiler_options
from jaxflowers.data.augment import Augmentation, normalize
from jaxflowers.models import init_rng
from jaxflowers.parallel.data_parallel import AXIS
from jaxflowers.training import learn_rates
from jaxflowers.training.layout import FlatParams

__all__ = ["SEED", "StepConfig", "TrainState", "init_program", "init_state", "init_variables",
           "cross_entropy", "sample_keys", "train_block", "train_step", "train_streamed"]


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training; one goes in, a new one comes out."""

    step: jax.Array  # int32 scalar, iterations done
    params: Any  # float32 pytree, or one float32 vector (StepConfig.flat)
    batch_stats: Any  # batch-norm running statistics (float32 pytree)
    opt_state: Any  # optax state
    key: jax.Array  # uint32 (2,) raw PRNG key data, fixed; per-step keys fold in `step`
    halted: jax.Array  # int32 scalar: 0, or the iteration whose loss or gradient was not finite

    def stored_variables(self) -> dict:
        """``{"params": ..., "batch_stats": ...}`` as stored (flat or tree parameters)."""
        return {"params": self.params, "batch_stats": self.batch_stats}


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The static parts of a step (closed over, never traced)."""

    model: Any  # flax module with dtype / bn_axis_name already set
    solver: Callable  # hyperparameters -> (optax solver, schedule): optimizer.Solver
    augmentation: Augmentation | None
    dtype: Any
    sync_batch_norm: bool
    flat: FlatParams | None = None  # parameters (and so gradients, solver state) as one vector
    factors: tuple[float, ...] | None = None  # learn-rate factor per parameter leaf; None: all 1
    frozen: frozenset = frozenset()  # module paths of frozen batch-norm layers

    def variables(self, state: TrainState) -> dict:
        """``{"params": tree, "batch_stats": ...}`` of a state, whichever the layout."""
        return self.unpack(state.stored_variables())

    def unpack(self, variables: dict) -> dict:
        """Variables with the parameters as the model's tree (``FlatParams.unpack``)."""
        return variables if self.flat is None else self.flat.unpack(variables)


SEED = jax.ShapeDtypeStruct((), jnp.uint32)  # the init programs' argument


def init_state(model, tx, image_shape, seed: int, flat: FlatParams | None = None) -> TrainState:
    """Initial ``TrainState`` (one parameter vector with ``flat``) on the default device."""
    return init_program(init_variables(model, image_shape), tx, flat)(np.uint32(seed))


def init_variables(model, image_shape):
    """The jitted ``seed -> {"params", "batch_stats"}`` of ``model`` for (H, W, C) images."""
    # Shared by jax.eval_shape (the layout) and init_program, so JAX traces it once.
    @jax.jit  # nested in init_program's, which carries the compiler options
    def variables(seed):
        # why models.init_rng: a counter-based hash generator, the same distributions in a
        # program that compiles faster.
        return model.init(init_rng.key(seed), jnp.zeros((1, *image_shape), jnp.float32),
                          train=False)

    return variables


def init_program(variables, tx, flat: FlatParams | None = None):
    """The jitted ``(seed, start=None) -> TrainState``; seed and ``start`` (a partial
    ``{"params", "batch_stats"}`` tree replacing drawn leaves: pretrained weights) are
    arguments, so one program serves every seed and weights never become constants."""
    @functools.partial(jax.jit, compiler_options=compiler_options())
    def _init(seed, start=None):
        data_key = jax.random.split(jax.random.PRNGKey(seed))[1]
        initial = variables(seed)
        if start is not None:
            initial = _overlay(initial, start, ())
        params, batch_stats = initial["params"], initial.get("batch_stats", {})
        if flat is not None:
            params, batch_stats = flat.ravel(params), flat.stats_stored(batch_stats)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          batch_stats=batch_stats, opt_state=tx.init(params), key=data_key,
                          halted=jnp.zeros((), jnp.int32))

    return _init


def _overlay(tree, start, path: tuple):
    """``tree`` with the leaves ``start`` holds replaced by them (same shapes, float32)."""
    if not isinstance(start, dict):
        if tuple(start.shape) != tuple(tree.shape):
            raise ValueError(f"the starting weights' {'/'.join(path)} has shape "
                             f"{tuple(start.shape)}; the network's is {tuple(tree.shape)}")
        return jnp.asarray(start, tree.dtype)
    unknown = [key for key in start if key not in tree]
    if unknown:
        raise ValueError(f"the starting weights have {'/'.join((*path, unknown[0]))}, which "
                         "the network lacks")
    return {key: _overlay(value, start[key], (*path, key)) if key in start else value
            for key, value in tree.items()}


def sample_keys(state: TrainState, batch_size: int, step=None) -> jax.Array:
    """One PRNG key per sample of this device's rows, by (step, position in the global batch).

    So the same seed augments alike on 1 or N devices. ``step``: the iteration (default the
    state's next)."""
    step = state.step if step is None else step
    step_key = jax.random.fold_in(jax.random.wrap_key_data(state.key), step)
    positions = lax.axis_index(AXIS) * batch_size + jnp.arange(batch_size)
    return jax.vmap(lambda p: jax.random.fold_in(step_key, p))(positions)


def train_step(state: TrainState, images: jax.Array, labels: jax.Array, stats, hyper,
               cfg: StepConfig, draws=None) -> tuple[TrainState, dict]:
    """One iteration on this device's (b, H, W, C) uint8 images and (b,) labels; ``hyper``:
    the solver's hyperparameters (``optimizer.hyperparameters``); ``draws``: the
    augmentation's choices for the images, drawn here when None."""
    if cfg.augmentation is not None:
        if draws is None:
            draws = cfg.augmentation.draw(sample_keys(state, images.shape[0]),
                                          images.shape[1:3])
        images = cfg.augmentation.apply(images, draws)
    x = normalize(images, stats[0], stats[1], cfg.dtype)

    stats_tree = state.batch_stats if cfg.flat is None else cfg.flat.stats_tree(state.batch_stats)

    def loss_fn(params):
        params = learn_rates.stop_frozen(params, cfg.factors)  # no gradient for frozen ones
        with learn_rates.frozen_layers(cfg.frozen):
            logits, updates = cfg.model.apply(
                {"params": params, "batch_stats": stats_tree}, x, train=True,
                mutable=["batch_stats"])
        loss = cross_entropy(logits, labels).mean()
        return loss, (logits, updates["batch_stats"])

    params = cfg.variables(state)["params"]
    (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    if cfg.flat is not None:
        grads = cfg.flat.ravel(grads)  # gradients per leaf, then one vector
        batch_stats = cfg.flat.stats_stored(batch_stats)
    # The one gradient all-reduce: the mean of per-device gradients is the gradient of the
    # global-batch loss (equal per-device batches). shard_map runs with check_vma=False, so
    # nothing was summed implicitly before this.
    grads = lax.pmean(grads, AXIS)
    if not cfg.sync_batch_norm:
        # Per-device running statistics would drift apart; average them so every replica
        # evaluates with the same model. (With sync BN they are already identical.)
        batch_stats = lax.pmean(batch_stats, AXIS)
    # Frozen layers' statistics exactly as stored (a mean of equal values may round).
    batch_stats = learn_rates.keep_frozen_stats(batch_stats, state.batch_stats, cfg.frozen,
                                                cfg.flat and cfg.flat.stats)
    correct = jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))
    # Mini-batch loss and accuracy of the global batch: average of the device means.
    metrics = lax.pmean({"loss": loss, "accuracy": correct}, AXIS)
    # Judged on all-reduced values, so every device takes the same decision.
    finite = jnp.isfinite(metrics["loss"]) & _all_finite(grads)
    tx, schedule = cfg.solver(hyper)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    # A non-finite step leaves the parameters and batch-norm statistics as they were (the
    # update is zeroed inside its own elementwise kernel) and halts the run; the solver
    # state may then hold non-finite values, but it is never used again: every later step
    # is skipped, and nothing is checkpointed after a halt.
    updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros((), u.dtype)), updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    new_state = state.replace(
        step=jnp.where(finite, state.step + 1, state.step),
        params=optax.apply_updates(state.params, updates),
        batch_stats=keep(batch_stats, state.batch_stats), opt_state=opt_state,
        halted=jnp.where(finite, 0, state.step + 1).astype(jnp.int32))
    metrics["learn_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    metrics["finite"] = finite.astype(jnp.float32)
    return new_state, metrics


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample softmax cross-entropy of (B, K) logits and (B,) integer labels.

    ``optax.softmax_cross_entropy_with_integer_labels``'s values; the label's logit is picked
    by a mask, whose gradient is elementwise, not a scatter (a kernel of its own on GPUs)."""
    picked = jnp.where(labels[:, None] == jnp.arange(logits.shape[-1]), logits, 0)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(picked, axis=-1)


def _all_finite(tree) -> jax.Array:
    """Whether every element of every leaf is finite (one reduction per leaf)."""
    return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)]))


def train_block(state: TrainState, images, labels, order, first_row, stats, hyper, limit, *,
                cfg: StepConfig, length: int) -> tuple[TrainState, dict]:
    """Up to ``length`` iterations in one dispatch, stopping at iteration ``limit``.

    Args:
      state: replicated ``TrainState``.
      images, labels: (N, H, W, C) uint8 and (N,) int32, the whole resident training set.
      order: (rows, b) int32, this device's columns of the batches of iterations
        ``first_row``, ``first_row + 1``, ...: a window of the plan that holds this block's
        (``ResidentData.window``), so no shape grows with the number of epochs.
      first_row: int32 scalar, the iteration of ``order``'s first row.
      stats: per-channel (mean, std), float32 (C,) each.
      hyper: the solver's hyperparameters (``optimizer.hyperparameters``):
        arguments, so that other values reuse the compiled block.
      limit: int32 scalar; later iterations (and all after a halt) are skipped.
      length: static, the most iterations it runs.

    Returns:
      The new state and per-iteration metrics, each (length,).
    """
    def one(state):
        idx = lax.dynamic_index_in_dim(order, state.step - first_row, keepdims=False)
        return train_step(state, *_rows((images, labels), idx), stats, hyper, cfg)

    if length == 1:
        return _single(one, state)

    # A while loop that stops at the limit or a halt: no branch in its body, whose operands and
    # results XLA would copy every iteration.
    first, names = state.step, ("loss", "accuracy", "learn_rate", "finite")
    end = jnp.minimum(first + length, limit)
    draws = None
    if cfg.augmentation is not None:  # every iteration's choices at once, before the loop
        size = images.shape[1:3]
        draws = jax.vmap(lambda step: cfg.augmentation.draw(
            sample_keys(state, order.shape[1], step), size))(first + jnp.arange(length))

    def running(carry):
        state, _ = carry
        return (state.step < end) & (state.halted == 0)

    def body(carry):
        state, rows = carry
        i = state.step - first
        idx = lax.dynamic_index_in_dim(order, state.step - first_row, keepdims=False)
        mine = None if draws is None else jax.tree.map(
            lambda d: lax.dynamic_index_in_dim(d, i, keepdims=False), draws)
        state, metrics = train_step(state, *_rows((images, labels), idx), stats, hyper, cfg,
                                    mine)
        row = jnp.stack([metrics[name] for name in names])
        return state, lax.dynamic_update_index_in_dim(rows, row, i, 0)

    # Iterations after the limit or a halt report zeros.
    state, rows = lax.while_loop(running, body,
                                 (state, jnp.zeros((length, len(names)), jnp.float32)))
    return state, {name: rows[:, j] for j, name in enumerate(names)}


def _rows(arrays: tuple, idx) -> tuple:
    """Each array's rows ``idx``: one batch of the resident set, whose indices are in range."""
    return tuple(a.at[idx].get(mode="promise_in_bounds") for a in arrays)


def train_streamed(state: TrainState, images, labels, stats, hyper, *,
                   cfg: StepConfig) -> tuple[TrainState, dict]:
    """One iteration on streamed (b, H, W, C) uint8 images, (b,) labels; as ``train_block``."""
    return _single(lambda s: train_step(s, images, labels, stats, hyper, cfg), state)


def _single(one: Callable, state: TrainState):
    state, metrics = one(state)
    return state, jax.tree.map(lambda m: m[None], metrics)
