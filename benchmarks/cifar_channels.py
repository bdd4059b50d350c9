"""The sweep's networks computed on padded channels: ``cifar_net(depth, channel_multiple=m)``
trained through ``train`` on 45,000 synthetic 32x32 images (SGDM, the sweep's augmentation,
128 images), each depth and multiple in turn, rounds alternating in one process.

    python benchmarks/cifar_channels.py [--depths 1 2 3 4] [--multiples 1 8 16] [--rounds 2]
        [--precisions auto float32] [--profile-epochs 2] [--top 25] [--out FILE.json]

Multiple 1 computes on MATLAB's widths (depth 3: 9/18/36 channels, which cuDNN pads for its
tensor cores in every convolution); 8 and 16 round each layer's channels up with zeros, so the
network, its stored weights and its gradients are the same. Prints each run's median step
(``bench.measure``) and, per depth, the median over rounds. ``--precisions`` adds the compute
dtype (``ExecutionOptions.precision``; "auto" is bfloat16 on GPUs). ``--profile-epochs N``
then trains each configuration N epochs under ``jax.profiler`` and prints its GPU kernels
per step by kind and name (``trace_summary.py``).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--precisions", nargs="+", default=["auto"])
    parser.add_argument("--profile-epochs", type=int, default=0)
    parser.add_argument("--top", type=int, default=25, help="kernels listed per profile")
    parser.add_argument("--out", help="JSON file for the rows (and the profiles)")
    args = parser.parse_args()

    import jax

    import jaxflowers as jf
    from jaxflowers import bench, recipes

    rng = np.random.default_rng(0)
    data = jf.data.ImageSet(rng.integers(0, 256, (45000, 32, 32, 3), dtype=np.uint8),
                            rng.integers(0, 10, 45000), tuple("abcdefghij"))
    opts = jf.TrainingOptions(solver="sgdm", mini_batch_size=args.batch, verbose=False,
                              augmentation=recipes.augmentation("sweep"),
                              shuffle="every-epoch")
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    configs = [(d, m, p) for d in args.depths for m in args.multiples for p in args.precisions]
    rows, profiles = [], {}
    for round_ in range(args.rounds):
        for depth, multiple, precision in configs:
            model = jf.models.cifar_net(depth, channel_multiple=multiple)
            row = bench.measure(data, model, opts, window_steps=256, windows=5,
                                execution=jf.ExecutionOptions(precision=precision))
            rows.append({"round": round_, "depth": depth, "channel_multiple": multiple,
                         "precision": precision, "step_ms": 1e3 * row["step_s"],
                         "compile_s": row["compile_s"], "images_per_s": row["images_per_s"]})
            print(json.dumps(rows[-1]), flush=True)
            _save(args.out, rows, profiles)
    if args.profile_epochs:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from trace_summary import find_trace, summarize
        for depth, multiple, precision in configs:
            model = jf.models.cifar_net(depth, channel_multiple=multiple)
            run = opts.replace(max_epochs=args.profile_epochs, plots="none")
            execution = jf.ExecutionOptions(precision=precision)
            jf.train(data, model, run, execution=execution)  # compiled once, outside the trace
            folder = tempfile.mkdtemp(prefix="cifar_profile_")
            # without Python's tracer: a training's thousands of host events per step would
            # make the trace's conversion take minutes
            quiet = jax.profiler.ProfileOptions()
            quiet.python_tracer_level = 0
            with jax.profiler.trace(folder, create_perfetto_trace=True, profiler_options=quiet):
                jf.train(data, model, run, execution=execution)
            steps = args.profile_epochs * (len(data) // args.batch)
            tag = f"depth {depth}, multiple {multiple}, {precision}"
            profiles[tag] = summarize(find_trace(folder), steps, tag, top=args.top)
            _save(args.out, rows, profiles)
    print("depth | " + " | ".join(f"multiple {m}, {p} ms"
                                   for m in args.multiples for p in args.precisions))
    for depth in args.depths:
        cells = [statistics.median(r["step_ms"] for r in rows if r["depth"] == depth
                                   and r["channel_multiple"] == m and r["precision"] == p)
                 for m in args.multiples for p in args.precisions]
        print(f"{depth} | " + " | ".join(f"{c:.3f}" for c in cells))


def _save(path, rows, profiles):
    """Write what was measured so far (a run cut short keeps it)."""
    if path:
        with open(path, "w") as f:
            json.dump({"rows": rows, "profiles": profiles}, f, indent=1)


if __name__ == "__main__":
    main()
