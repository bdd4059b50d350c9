"""Do two trees train alike, bit for bit? python benchmarks/solver_bits.py --tree a=DIR --tree b=.

Trains cifar_net (depth 1 by default) on the embedded digits (32x32) for 3 epochs with
several solver setups (SGDM with L2 and piecewise drops or, as the sweep's recipe, a
constant rate; SGD with global-norm clipping; Adam with per-tensor clipping; RMSProp with
absolute-value clipping; Adam and RMSProp with epsilon and piecewise drops; Adam with
warm-up then cosine), each with the parameter tree
and the flat vector on 2 CPU devices (``--devices``), once per tree, each in its own process
with the tree first on ``PYTHONPATH``. Prints, per setup and layout, whether the final
parameters and every iteration's loss equal the first tree's, and if not, the first
iteration whose loss differs. For checking that a change to the training program (a
constant made an argument, say) leaves its arithmetic alone.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
import package_trees

SETUPS = {
    "sgdm, L2, piecewise": dict(solver="sgdm", initial_learn_rate=0.05, momentum=0.9,
                                l2_regularization=1e-3, learn_rate_schedule="piecewise",
                                learn_rate_drop_period=1, learn_rate_drop_factor=0.5),
    "sgdm, L2, constant rate": dict(solver="sgdm", initial_learn_rate=0.3, momentum=0.9,
                                    l2_regularization=4e-6),
    "sgd, global-norm clip": dict(solver="sgdm", initial_learn_rate=0.05, momentum=0.0,
                                  gradient_threshold=0.5,
                                  gradient_threshold_method="global-l2norm"),
    "adam, per-tensor clip": dict(solver="adam", initial_learn_rate=0.003,
                                  gradient_threshold=0.3, gradient_threshold_method="l2norm"),
    "rmsprop, absolute clip": dict(solver="rmsprop", initial_learn_rate=0.001,
                                   gradient_threshold=0.01,
                                   gradient_threshold_method="absolute-value"),
    "adam, epsilon, piecewise": dict(solver="adam", initial_learn_rate=0.003, epsilon=1e-6,
                                     learn_rate_schedule="piecewise", learn_rate_drop_period=1,
                                     learn_rate_drop_factor=0.3),
    "rmsprop, epsilon, drop to 0": dict(solver="rmsprop", initial_learn_rate=0.001,
                                        epsilon=1e-4, learn_rate_schedule="piecewise",
                                        learn_rate_drop_period=2, learn_rate_drop_factor=0.0),
    "adam, warm-up, cosine": dict(solver="adam", initial_learn_rate=0.002,
                                  learn_rate_schedule=("warmup", "cosine")),
}

CHILD = """
import json, sys
import numpy as np, jax
import jaxflowers as jf
from jaxflowers.data.embedded import digits
setups, out, epochs = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
depth, augment = int(sys.argv[4]), sys.argv[5]
augmentation = None if augment == "none" else jf.recipes.augmentation(augment)
data, results = digits(), {}
for layout in ("tree", "flat"):
    for name, kw in setups.items():
        if isinstance(kw.get("learn_rate_schedule"), list):
            kw["learn_rate_schedule"] = tuple(kw["learn_rate_schedule"])
        opts = jf.TrainingOptions(mini_batch_size=64, max_epochs=epochs, seed=1, verbose=False,
                                  plots="none", augmentation=augmentation, **kw)
        net, info = jf.train(data, jf.models.cifar_net(depth, num_classes=10), opts,
                             execution=dict(parameter_layout=layout))
        for i, leaf in enumerate(jax.tree.leaves(net.variables)):
            results[f"{name}|{layout}|v{i}"] = np.asarray(leaf)
        results[f"{name}|{layout}|loss"] = np.asarray(info.loss)
np.savez(out, **results)
"""


def train(tree: pathlib.Path, out: pathlib.Path, args) -> dict:
    """The arrays of every setup trained with ``tree``'s package."""
    import json

    env = package_trees.environment(tree, dict(
        os.environ, JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}"))
    subprocess.run([sys.executable, "-c", CHILD, json.dumps(SETUPS), str(out), str(args.epochs),
                    str(args.depth), args.augmentation], env=env, check=True)
    with np.load(out) as arrays:
        return dict(arrays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    package_trees.add_argument(parser)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--devices", type=int, default=2, help="CPU devices (data parallel)")
    parser.add_argument("--depth", type=int, default=1, help="cifar_net's depth")
    parser.add_argument("--augmentation", default="none", choices=("none", "sweep", "flowers"),
                        help="a MATLAB example's augmentation")
    args = parser.parse_args()
    trees = package_trees.parse(parser, args.tree)
    if len(trees) < 2:
        parser.error("--tree: two or more trees, the first compared with the others")
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: train(pathlib.Path(path).resolve(), pathlib.Path(tmp, f"{i}.npz"), args)
                   for i, (name, path) in enumerate(trees)}
    others, base = trees[1:], results[trees[0][0]]
    print(f"{'setup':30} {'layout':6} " + " ".join(f"{name:>24}" for name, _ in others))
    for setup in SETUPS:
        for layout in ("tree", "flat"):
            keys = [k for k in base if k.startswith(f"{setup}|{layout}|")]
            cells = []
            for name, _ in others:
                other = results[name]
                if all(np.array_equal(base[k], other[k]) for k in keys):
                    cells.append("bit-equal")
                    continue
                loss_a, loss_b = base[f"{setup}|{layout}|loss"], other[f"{setup}|{layout}|loss"]
                differ = np.nonzero(loss_a != loss_b)[0]
                cells.append(f"differs from iteration {differ[0]}" if len(differ)
                             else "parameters differ")
            print(f"{setup:30} {layout:6} " + " ".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
