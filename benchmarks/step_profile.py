"""Where a ResNet-50 step's GPU time goes: step variants timed, then traced with
``jax.profiler`` and their kernels summed per step (by name and by kind).

    python benchmarks/step_profile.py [VARIANT ...]   (default: all below)

Variants: ``plain_<solver>_<norm>[_<stem>]``, a plain ``jax.jit`` step of ResNet-50 on a synthetic
bfloat16 batch, solver sgdm | adam | adamflat (``optax.flatten``), norm flax
(``flax.linen.BatchNorm`` + ReLU) | custom (``jaxflowers.models.norm``) | none (a scale
only: the bound without batch norm), stem space_to_depth | conv (ResNet's stem option,
default its default); ``ours_<solver>_<aug|noaug><devices>[_tree]``: ``train``'s
own compiled block on resident data (``_tree``: parameters per leaf, not one vector); ``dp_<leaf|flat>``, a plain shard_map step over
every local device whose gradient all-reduce is one pmean per leaf or one of the
flattened gradient (the next lever for 2 GPUs, benchmarks/NOTES.md). Env: SIZE (224), MODEL (resnet50 or cifar_net:DEPTH[:CHANNEL_MULTIPLE]), BATCH (128 per
device), NSTEPS (20 per timing), SAVE_TRACE (variants whose perfetto trace to keep),
OUT (folder for step_profile.json/.txt).
"""
import json
import os
import shutil
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxflowers as jf
from jaxflowers.data.feed import ResidentData
from jaxflowers.parallel.data_parallel import DataParallel, select_devices
from jaxflowers.training.program import TrainProgram

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_summary import find_trace, summarize  # noqa: E402

OUT = os.environ.get("OUT", "."); os.makedirs(OUT, exist_ok=True)
SIZE = int(os.environ.get("SIZE", 224)); MODEL = os.environ.get("MODEL", "resnet50")
BATCH = int(os.environ.get("BATCH", 128)); N = int(os.environ.get("NSTEPS", 20))
WHICH = sys.argv[1:] or ["plain_sgdm_flax", "plain_sgdm_custom", "plain_sgdm_none", "plain_adam_custom",
                         "plain_adamflat_custom", "ours_adam_aug1", "ours_adam_aug2"]
rows, report = [], []
def log(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); report.append(s)

from typing import Any

import flax.linen as nn

import jaxflowers.models.cifar as C
import jaxflowers.models.resnet as R
from jaxflowers.models.norm import BatchNorm as CustomBN


class FlaxBN(nn.Module):
    use_running_average: bool = False; momentum: float = 0.9; epsilon: float = 1e-5
    dtype: Any = jnp.float32; axis_name: Any = None; relu: bool = False
    scale_init: Any = nn.initializers.ones
    @nn.compact
    def __call__(self, x):
        y = nn.BatchNorm(use_running_average=self.use_running_average, momentum=self.momentum, epsilon=self.epsilon,
                         dtype=self.dtype, axis_name=self.axis_name, scale_init=self.scale_init)(x)
        return nn.relu(y) if self.relu else y
class NoBN(FlaxBN):
    @nn.compact
    def __call__(self, x):
        s = self.param("scale", self.scale_init, (x.shape[-1],), jnp.float32)
        self.variable("batch_stats", "mean", lambda: jnp.zeros((1,)))
        y = (x * s).astype(self.dtype)
        return nn.relu(y) if self.relu else y
BNS = {"flax": FlaxBN, "custom": CustomBN, "none": NoBN}

def build_model(dtype=None, stem=None):
    """MODEL is a model name ("resnet50") or "cifar_net:DEPTH[:CHANNEL_MULTIPLE]"; stem: ResNet's
    stem option."""
    name, _, depth = MODEL.partition(":")
    depth, _, multiple = depth.partition(":")
    m = (jf.models.cifar_net(int(depth), 10, channel_multiple=int(multiple) if multiple else None)
         if name == "cifar_net" else getattr(jf.models, name)(5))
    if stem is not None:
        m = m.clone(stem=stem)
    return m.clone(dtype=dtype) if dtype is not None else m

def timeit(call, n=N, reps=3):
    jax.block_until_ready(call()); jax.block_until_ready(call())
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); out = None
        for _ in range(n): out = call()
        jax.block_until_ready(out); ts.append((time.perf_counter() - t) / n)
    return statistics.median(ts)

def _no_reduce(tree):
    return tree


def _training_step(model, tx, reduce_grads=_no_reduce, reduce_rest=_no_reduce):
    """(state, x, y) -> (state, loss) for a (params, batch_stats, opt_state) state; the
    reducers average gradients and the rest over devices in the data-parallel variants."""
    def step(st, x, y):
        p, bs, o = st
        def lf(p):
            logits, upd = model.apply({"params": p, "batch_stats": bs}, x, train=True, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), upd["batch_stats"]
        (l, bs2), g = jax.value_and_grad(lf, has_aux=True)(p)
        u, o = tx.update(reduce_grads(g), o, p)
        return (optax.apply_updates(p, u), reduce_rest(bs2), o), reduce_rest(l)
    return step


def _initial_state(model, tx):
    v = jax.jit(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, SIZE, SIZE, 3)), train=False))()
    return v["params"], v["batch_stats"], tx.init(v["params"])


def _caller(step, st, x, y):
    h = [st]
    def call():
        h[0], l = step(h[0], x, y); return l
    return call


def plain(solver, stem=None, dtype=jnp.bfloat16):
    model = build_model(dtype, stem)
    tx = {"sgdm": optax.sgd(0.01, momentum=0.9), "adam": optax.adam(1e-3), "adamflat": optax.flatten(optax.adam(1e-3))}[solver]
    x = jax.random.normal(jax.random.PRNGKey(0), (BATCH, SIZE, SIZE, 3), dtype); y = jnp.zeros((BATCH,), jnp.int32)
    step = jax.jit(_training_step(model, tx), donate_argnums=(0,))
    return _caller(step, _initial_state(model, tx), x, y), 1


def data_parallel(reduce, dtype=jnp.bfloat16):
    """A plain shard_map step over every local device (flat Adam, closed-form BN) whose
    gradient all-reduce is one pmean per leaf ("leaf") or one of the raveled vector ("flat")."""
    from jax.flatten_util import ravel_pytree
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    model, tx = build_model(dtype), optax.flatten(optax.adam(1e-3))
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    nd = len(jax.devices())
    st = jax.device_put(_initial_state(model, tx), NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (BATCH * nd, SIZE, SIZE, 3), dtype),
                       NamedSharding(mesh, P("data")))
    y = jax.device_put(jnp.zeros((BATCH * nd,), jnp.int32), NamedSharding(mesh, P("data")))

    def pmean(tree):
        return jax.lax.pmean(tree, "data")

    def pmean_flat(tree):
        flat, unravel = ravel_pytree(tree)
        return unravel(pmean(flat))

    per_device = _training_step(model, tx, pmean_flat if reduce == "flat" else pmean, pmean)
    step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                 out_specs=(P(), P()), check_vma=False), donate_argnums=(0,))
    return _caller(step, st, x, y), nd


def ours(nd, solver, aug, layout=None):
    """``train``'s own compiled block (``TrainProgram``) on a resident synthetic set."""
    rng = np.random.default_rng(0)
    n = 3670
    data = jf.data.ImageSet(rng.integers(0, 256, (n, SIZE, SIZE, 3), dtype=np.uint8), rng.integers(0, 5, n), tuple("abcde"))
    a = jf.data.Augmentation(reflect_x=True, translate_x=(-30, 30), translate_y=(-30, 30)) if aug else None
    opts = jf.TrainingOptions(solver=solver, mini_batch_size=BATCH * nd, augmentation=a,
                              max_epochs=200, verbose=False, shuffle="every-epoch")
    par = DataParallel(select_devices("auto", nd), "shard_map")
    execution = jf.ExecutionOptions(num_devices=nd, parameter_layout=layout or "auto")
    feed = ResidentData(data, mini_batch_size=BATCH * nd, num_epochs=200, shuffle="every-epoch", seed=0)
    resolved = execution.resolve(par.devices[0].platform, (SIZE, SIZE, 3), streamed=False)
    program = TrainProgram(par, build_model(), opts, resolved, feed=feed, input_shape=(SIZE, SIZE, 3))
    ready = program.prepare()
    held, total = [ready.state, 0], feed.order.shape[0]
    def call():
        held[0], metrics = ready.run(held[0], held[1], total)
        held[1] = min(held[1] + program.block_length, total); return metrics
    return call, nd

for w in WHICH:
    t0 = time.perf_counter()
    if w.startswith("dp_"):
        R.BatchNorm = C.BatchNorm = CustomBN
        call, nd = data_parallel(w.split("_")[1])
    elif w.startswith("plain"):
        _, solver, bn, *stem = w.split("_", 3)
        R.BatchNorm = C.BatchNorm = BNS[bn]
        call, nd = plain(solver, *stem)
    else:
        R.BatchNorm = C.BatchNorm = CustomBN
        _, solver, aug, *layout = w.split("_")
        call, nd = ours(int(aug[-1]), solver, aug.startswith("aug"), *layout)
    dt = timeit(call)
    ips = BATCH * nd / dt
    log(f"{w:22s} step {dt*1e3:7.2f} ms  {ips:8.0f} img/s  (setup+compile+time {time.perf_counter()-t0:.1f} s)")
    rows.append(dict(variant=w, step_ms=dt * 1e3, images_per_s=ips))
    d = f"/tmp/trace_{w}"
    with jax.profiler.trace(d, create_perfetto_trace=True):
        for _ in range(5): out = call()
        jax.block_until_ready(out)
    trace = find_trace(d)
    if trace:
        summarize(trace, 5, w, log)
        if os.environ.get("SAVE_TRACE") and w in os.environ["SAVE_TRACE"]:
            shutil.copy(trace, f"{OUT}/trace_{w}.json.gz")
    else: log("no perfetto trace in", d)
json.dump(rows, open(f"{OUT}/step_profile.json", "w"), indent=1)
open(f"{OUT}/step_profile.txt", "w").write("\n".join(report))
for r in rows: print(f"{r['variant']:22s} {r['step_ms']:7.2f} ms {r['images_per_s']:8.0f} img/s")
