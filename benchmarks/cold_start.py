"""Where a cold start's seconds go: each piece of ``train``'s start, alone in this process.

    python benchmarks/cold_start.py PIECE DATA [--per-device-batch 128] [--model resnet50]
        [--out FILE]

PIECE (run each in a fresh process, with no compilation cache, so every compile is cold;
``--trace DIR`` also profiles the compile and prints where XLA's time went):
  first-copy   a process's first device_put (4 floats), then the training set twice
  init         compile ResNet-50's init program as ``train`` builds it (hash-keyed weights)
  init-rbg     the same program with JAX's rbg keys instead (what ``train`` used before)
  block        compile the training block (traced against shapes, as ``train`` does)
  validation   compile the validation pass
  all          init, block and validation compiled at once, as ``train`` does

DATA is a folder of class folders (``benchmarks/synthetic_folders.py flowers DEST``); the
MATLAB example's recipe (90/10 split, 128 images per device) on every local device, or with
``--model cifar_net:DEPTH`` the sweep's network and recipe (32 px, SGDM, the sweep's
augmentation; DATA e.g. CIFAR-10's class folders). Prints one JSON line: seconds of wall
time and of process CPU time (all threads) per step.
"""
import argparse
import concurrent.futures
import json
import resource
import time

T0 = time.perf_counter()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("piece", choices=("first-copy", "init", "init-rbg", "block",
                                          "validation", "all"))
    parser.add_argument("data")
    parser.add_argument("--per-device-batch", type=int, default=128)
    parser.add_argument("--model", default="resnet50",
                        help="resnet50 (the Flowers example) or cifar_net:DEPTH (the sweep's)")
    parser.add_argument("--out", help="append the JSON line to this file")
    parser.add_argument("--trace", help="write a jax.profiler trace of the compile to this "
                        "folder and print its host events (XLA's passes) by total time")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxflowers import recipes
    from jaxflowers.data.feed import ResidentData, image_shape
    from jaxflowers.options.execution import ExecutionOptions
    from jaxflowers.parallel.data_parallel import REPLICATED, DataParallel, select_devices
    from jaxflowers.training.program import TrainProgram

    devices = select_devices("auto", None)
    row = {"piece": args.piece, "devices": len(devices), "device": devices[0].device_kind,
           "jax": jax.__version__, "backend_start_s": round(time.perf_counter() - T0, 2)}

    def timed(name, fn):
        if args.trace and name == "compile":
            fn = _traced(fn, args.trace)
        wall, cpu = time.perf_counter(), _cpu()
        result = fn()
        row[name] = {"wall_s": round(time.perf_counter() - wall, 2),
                     "cpu_s": round(_cpu() - cpu, 2)}
        return result

    name, _, depth = args.model.partition(":")
    data = recipes.load_data(args.data, image_size=recipes.IMAGE_SIZE[name])
    train_set, test_set = data.split_each_label(0.9, seed=0)
    row["model"] = args.model
    parallel = DataParallel(devices, "shard_map")
    if args.piece == "first-copy":
        images = timed("read_training_set", lambda: np.array(train_set.images))
        timed("first_copy_4_floats", lambda: jax.block_until_ready(
            jax.device_put(np.zeros(4, np.float32), devices[0])))
        for name in ("copy_training_set", "copy_training_set_again"):
            timed(name, lambda: jax.block_until_ready(parallel.put(images, REPLICATED)))
    else:
        if name == "resnet50":
            opts = recipes.flowers_options(len(devices), len(train_set),
                                           per_device_batch=args.per_device_batch,
                                           validation_data=test_set, verbose=False,
                                           max_epochs=1)
        else:
            opts = recipes.sweep_options(len(train_set), max_epochs=1,
                                         mini_batch_size=args.per_device_batch * len(devices),
                                         validation_data=test_set, verbose=False)
        shape = image_shape(train_set)
        spec = name if name == "resnet50" else (name, {"depth": int(depth)})
        model = recipes.build_model(spec, len(data.class_names))

        def setup():
            feed = ResidentData(train_set, mini_batch_size=opts.mini_batch_size, num_epochs=1,
                                shuffle=opts.shuffle, seed=opts.seed)
            resolved = ExecutionOptions().resolve(devices[0].platform, shape, streamed=False)
            return TrainProgram(parallel, model, opts, resolved, feed=feed, input_shape=shape)

        program = timed("setup_and_init_trace", setup)
        forward = program.forward
        def init():  # the initial state's program takes the seed and the first iteration
            return program.init.lower(np.uint32(0), program.start).compile()

        validation = (lambda: forward.compile(program.variable_shapes(),
                                              forward.abstract(len(test_set), shape),
                                              program.stats_shape))
        if args.piece == "init":
            timed("compile", init)
        elif args.piece == "init-rbg":
            timed("compile", lambda: _rbg_init(program, jnp).lower().compile())
        elif args.piece == "block":
            timed("compile", lambda: program.lower_block().compile())
        elif args.piece == "validation":
            timed("compile", validation)
        else:
            def together():
                with concurrent.futures.ThreadPoolExecutor(3) as pool:
                    jobs = [pool.submit(init),
                            pool.submit(lambda: program.lower_block().compile()),
                            pool.submit(validation)]
                    for job in jobs:
                        job.result()
            timed("compile", together)
    if args.trace:
        print("\n".join(trace_summary(args.trace)))
    line = json.dumps(row)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


def _traced(fn, folder):
    def run():
        import jax
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # only XLA's and JAX's own (C++) events
        with jax.profiler.trace(folder, profiler_options=options):
            return fn()
    return run


def trace_summary(folder: str, top: int = 30) -> list[str]:
    """The trace's complete events by name (digits folded), most total time first: seconds
    summed over every thread (so CPU-seconds for XLA's parallel work), count, threads."""
    import collections
    import glob
    import gzip
    import re

    path = sorted(glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True))[-1]
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    total, count = collections.defaultdict(float), collections.Counter()
    threads = collections.defaultdict(set)
    for event in events:
        name = re.sub(r"\d+", "#", event["name"])[:90]
        total[name] += event.get("dur", 0) / 1e6
        count[name] += 1
        threads[name].add(event["tid"])
    lines = [f"{path}: {len(events)} events"]
    for name, seconds in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{seconds:9.3f} s  n={count[name]:6d}  "
                     f"threads={len(threads[name]):3d}  {name}")
    return lines


def _rbg_init(program, jnp):
    """``train``'s init program with JAX's rbg keys instead of the hash generator."""
    import jax

    key, flat, tx = jax.random.key(0, impl="rbg"), program.cfg.flat, program.layout.tx

    @jax.jit
    def init():
        variables = program.model.init(key, jnp.zeros((1, *program.input_shape), jnp.float32),
                                       train=False)
        params = variables["params"] if flat is None else flat.ravel(variables["params"])
        return variables, tx.init(params)

    return init


if __name__ == "__main__":
    main()
