"""ResNet-50's training step with its convolutions lowered three ways: as the package does
(cuDNN convolutions), with every 1x1 convolution as a matrix product (``lax.dot_general``: XLA
then emits GEMMs and may fuse their operands' elementwise producers), and with XLA's cuDNN
convolution fusions on (``--xla_gpu_experimental_enable_conv_fusion``).

    python benchmarks/conv_lowering.py [--variants conv dot conv-fusion] [--rounds 2]
        [--batch 128] [--model resnet50] [--scratch DIR] [--out FILE.json]
    python benchmarks/conv_lowering.py --check [--check-network resnet50] [--check-size 64]

Each run is ``python -m jaxflowers.bench`` (one GPU, shard_map, Adam, the Flowers
augmentation) in a fresh process; the variants alternate, their order reversed every other
round. "dot" runs a copy of this checkout's package, written under ``--scratch``, whose
``models/layers.py`` ends with a ``Conv`` that computes 1x1 kernels as products (the same
function; ``--check`` compares a small ResNet's outputs and gradients on the CPU). The copy
also serves ``gpu_kernels.py --tree dot=SCRATCH/dot``. Prints each run's step and compile
time, then the median step per variant.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(HERE), "jaxflowers")
FLAGS = {"conv-fusion": "--xla_gpu_experimental_enable_conv_fusion=true"}

# Appended to the copy's models/layers.py: every module that builds a ``Conv`` afterwards
# gets this one (flax names it "Conv" as before, so the parameters keep their names).
DOT_PATCH = '''

from jax import lax as _lax

_ConvolutionConv = Conv


class Conv(_ConvolutionConv):
    """``Conv`` whose 1x1 kernels (stride s, no padding) are a product over channels."""

    @nn.compact
    def __call__(self, inputs):
        size = self.kernel_size
        size = (size,) * 2 if isinstance(size, int) else tuple(size)
        strides = self.strides or 1
        strides = (strides,) * 2 if isinstance(strides, int) else tuple(strides)
        unpadded = self.padding in ("SAME", "VALID") or (
            not isinstance(self.padding, str) and all(tuple(p) == (0, 0) for p in self.padding))
        if (size != (1, 1) or inputs.ndim != 4 or not unpadded or self.feature_group_count != 1
                or self.input_dilation not in (None, 1, (1, 1)) or self.mask is not None):
            return super().__call__(inputs)
        kernel = self.param("kernel", self.kernel_init, (1, 1, inputs.shape[-1], self.features),
                            self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        if strides != (1, 1):
            inputs = inputs[:, ::strides[0], ::strides[1], :]
        y = _lax.dot_general(inputs, kernel[0, 0], (((3,), (0,)), ((), ())),
                             precision=self.precision)
        return y if bias is None else y + bias
'''

CHECK = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from jaxflowers import models
name = sys.argv[2]
if name.startswith("resnet:"):  # a small bottleneck ResNet of these stage sizes, 16 filters
    stages = tuple(map(int, name.removeprefix("resnet:").split(",")))
    net = models.resnet(stages, num_classes=5, num_filters=16)
else:
    net = getattr(models, name)(num_classes=5)
size = int(sys.argv[3])
x = jnp.asarray(np.random.default_rng(0).random((2, size, size, 3)), jnp.float32)
variables = jax.jit(net.init)(jax.random.key(0), x)
def loss(params):
    out, _ = net.apply({**variables, "params": params}, x, mutable=["batch_stats"])
    return out.sum(), out
(_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(variables["params"])
flat = [np.asarray(out).ravel()] + [np.asarray(g).ravel() for g in jax.tree_util.tree_leaves(grads)]
names = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(grads)]
np.savez(sys.argv[1], values=np.concatenate(flat), names=np.array(names))
"""


def write_dot_tree(scratch: str) -> str:
    """A copy of this checkout's package with ``DOT_PATCH`` appended; returns its root."""
    root = os.path.join(scratch, "dot")
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(PACKAGE, os.path.join(root, "jaxflowers"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(root, "jaxflowers", "models", "layers.py"), "a") as f:
        f.write(DOT_PATCH)
    return root


def outputs(root: str, path: str, network: str = "resnet50", size: int = 64):
    """A ResNet's outputs and gradients (one vector) and its parameters' names, computed on
    the CPU by the package under ``root`` on two ``size`` px images, compiled as one program
    (op by op took three times as long); kept in ``path``."""
    env = {**os.environ, "PYTHONPATH": root, "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", CHECK, path, network, str(size)], env=env, cwd=root,
                   check=True)
    with np.load(path) as found:
        return found["values"], list(found["names"])


def compare(conv, dot) -> dict:
    """Largest difference of two ``outputs``; raises if their parameters' names differ."""
    if conv[1] != dot[1]:
        raise ValueError("dot's parameters are not named as conv's")
    return {"max_abs_difference": float(np.abs(conv[0] - dot[0]).max()),
            "max_abs_value": float(np.abs(conv[0]).max()), "values": int(conv[0].size)}


def run(variant: str, root: str, model: str, batch: int, out: str) -> dict:
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "XLA_FLAGS": FLAGS.get(variant, "")}
    command = [sys.executable, "-m", "jaxflowers.bench", "--models", model, "--devices",
               "1", "--strategies", "shard_map", "--scalings", "weak", "--per-device-batch",
               str(batch), "--out", out]
    subprocess.run(command, env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "bench.json")) as f:
        report = json.load(f)
    row = next(r for r in report["results"] if r["framework"] == "jaxflowers")
    return {"variant": variant, "step_ms": 1e3 * row["step_s"],
            "images_per_s": row["images_per_s"], "compile_s": row["compile_s"],
            "device": report["environment"]["device_kind"], "jax": report["environment"]["jax"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["conv", "dot", "conv-fusion"],
                        choices=["conv", "dot", "conv-fusion"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--model", default="resnet50", help="the bench's model")
    parser.add_argument("--scratch", help="folder for the dot tree and the runs (default: temp)")
    parser.add_argument("--check", action="store_true",
                        help="only compare dot against conv on the CPU, then stop")
    parser.add_argument("--check-network", default="resnet50",
                        help="a ResNet of models, or resnet:1,1: bottleneck stages of 16 filters")
    parser.add_argument("--check-size", type=int, default=64, help="its images' size")
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args()

    scratch = args.scratch or tempfile.mkdtemp(prefix="conv-lowering-")
    os.makedirs(scratch, exist_ok=True)
    checkout = os.path.dirname(PACKAGE)
    trees = {"conv": checkout, "conv-fusion": checkout, "dot": write_dot_tree(scratch)}
    print(f"dot tree: {trees['dot']}", flush=True)
    if args.check:
        found = [outputs(trees[name], os.path.join(scratch, f"check-{name}.npz"),
                         args.check_network, args.check_size) for name in ("conv", "dot")]
        print(json.dumps(compare(*found)), flush=True)
        return
    rows = []
    for round_ in range(args.rounds):
        order = args.variants if round_ % 2 == 0 else args.variants[::-1]
        for variant in order:
            out = os.path.join(scratch, f"run-{len(rows)}-{variant}")
            row = run(variant, trees[variant], args.model, args.batch, out)
            rows.append({"round": round_, **row})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "batch": args.batch, "rows": rows}, f, indent=1)
    print(f"\n{'variant':>12} {'median step ms':>15} {'images/s':>10} {'compile s':>10}")
    for variant in args.variants:
        mine = [r for r in rows if r["variant"] == variant]
        step = statistics.median(r["step_ms"] for r in mine)
        print(f"{variant:>12} {step:15.2f} {args.batch * 1e3 / step:10.0f} "
              f"{statistics.median(r['compile_s'] for r in mine):10.1f}")


if __name__ == "__main__":
    main()
