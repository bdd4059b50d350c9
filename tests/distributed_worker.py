"""One process of a multi-process test run (``tests/test_distributed.py`` starts several).

Joins through ``distributed.initialize`` from ``$JAXFLOWERS_COORDINATOR``,
``$JAXFLOWERS_NUM_PROCESSES`` and ``$JAXFLOWERS_PROCESS_ID``, then runs one task:

* ``train``: 3 steps on the tiny ResNet (resident), a ragged prediction, then a streamed
  training that process 0's ``output_fn`` stops early; writes ``process<i>.npz`` into
  ``--out``;
* ``forever``: trains until killed; process 0 prints ``iteration N`` as it goes;
* ``terminated``: as ``forever``, checkpointing into ``--out``; every process prints
  ``RESULT <stop> <iterations> <checkpoint>`` once a stop signal ends the run.

The test process imports ``train_tiny``, ``train_stopped`` and ``predict_ragged`` for its
one-process reference.
"""
import argparse
import pathlib
import sys
import time

import jax
import numpy as np

import jaxflowers as jf
from jaxflowers.distributed import join as distributed
from jaxflowers.parallel import data_parallel as parallel

BATCH = 8  # global mini-batch: 24 images make 3 steps an epoch


def _data(n=24):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return jf.data.ImageSet(images, np.arange(n) % 3, ("a", "b", "c"))


def _tiny_resnet():
    # As tests/test_parallel.py: no biases before batch norm, so Adam's noise stays put.
    return jf.models.ResNet(stage_sizes=(1, 1), block_cls=jf.models.BottleneckBlock,
                            num_classes=3, num_filters=4)


def tiny_options(max_epochs=1, output_fn=None, verbose=True, checkpoints=None):
    """The tiny run's options; ``checkpoints``: a folder to checkpoint into every iteration."""
    return jf.TrainingOptions(
        solver="adam", initial_learn_rate=0.05, mini_batch_size=BATCH, max_epochs=max_epochs,
        shuffle="every-epoch", verbose=verbose, verbose_frequency=1, seed=3,
        output_fn=output_fn, checkpoint_path=checkpoints, checkpoint_frequency_unit="iteration",
        augmentation=jf.data.Augmentation(reflect_x=True, translate_x=(-3, 3),
                                           translate_y=(-3, 3)))


def train_tiny(placement="resident", max_epochs=1, output_fn=None, verbose=True,
               checkpoints=None, resume=None):
    """``(net, info)`` of the tiny ResNet, sync batch norm, on every device of every process."""
    opts = tiny_options(max_epochs, output_fn, verbose, checkpoints)
    execution = jf.ExecutionOptions(sync_batch_norm=True, data_placement=placement)
    return jf.train(_data(), _tiny_resnet(), opts, execution=execution, resume=resume)


def train_stopped():
    """Streamed, 2 epochs (6 steps), ``output_fn`` asks to stop at iteration 2 (only process
    0 runs it; the others must stop at the same step)."""
    def stop_at_2(message):
        return message["state"] == "iteration" and message["iteration"] == 2

    return train_tiny("stream", max_epochs=2, output_fn=stop_at_2, verbose=False)


def predict_ragged(net):
    """float32 (13, 3) scores of 13 fresh images: 13 does not split over 4 devices."""
    images = np.random.default_rng(1).integers(0, 256, (13, 32, 32, 3), dtype=np.uint8)
    return jf.predict(net, images, mini_batch_size=2)


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _refusal(fn) -> str:
    try:
        fn()
    except (RuntimeError, ValueError) as error:
        return str(error)
    return ""


def _train_task(out: pathlib.Path, second_call_error: str) -> None:
    pmap_error = _refusal(lambda: parallel.DataParallel(jax.devices(), "pmap"))
    t0 = time.perf_counter()
    # Checkpointed every iteration: every process takes part in each orbax save.
    net, info = train_tiny("resident", checkpoints=str(out / "checkpoints"))
    scores = predict_ragged(net)
    net_s, info_s = train_stopped()
    arrays = {f"resident{k}": v for k, v in _flat(net.variables).items()}
    arrays.update({f"stream{k}": v for k, v in _flat(net_s.variables).items()})
    np.savez(out / f"process{jax.process_index()}.npz", **arrays, loss=info.loss,
             stream_loss=info_s.loss, stream_stopped=info_s.stopped_early, scores=scores,
             num_devices=info.num_devices,
             step_time=info.train_time / len(info.loss), wall=time.perf_counter() - t0,
             second_call_error=second_call_error, pmap_error=pmap_error,
             checkpoint=str(info.checkpoint))


def _forever_task() -> None:
    def report(message):
        if message["state"] == "iteration":
            print(f"iteration {message['iteration']}", flush=True)

    train_tiny(max_epochs=100_000, output_fn=report, verbose=False)


def _terminated_task(out: pathlib.Path) -> None:
    def report(message):
        if message["state"] == "iteration":
            print(f"iteration {message['iteration']}", flush=True)

    _, info = train_tiny(max_epochs=100_000, output_fn=report, verbose=False,
                         checkpoints=str(out / "checkpoints"))
    print(f"RESULT {info.stopped_by.value} {len(info.loss)} {info.checkpoint}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", choices=("train", "forever", "terminated"))
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    # A lost process is noticed within ~10 s, so the kill test ends well inside a minute.
    distributed.initialize(heartbeat_timeout_seconds=10)
    second_call_error = _refusal(distributed.initialize)
    jf.enable_compilation_cache()  # $JAXFLOWERS_COMPILE_CACHE: "terminated" loads "forever"'s
    if args.task == "train":
        _train_task(args.out, second_call_error)
    elif args.task == "terminated":
        _terminated_task(args.out)
    else:
        _forever_task()
    return 0


if __name__ == "__main__":
    sys.exit(main())
