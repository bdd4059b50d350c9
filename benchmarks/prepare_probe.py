"""For ``program_loading.py`` and ``trace_time.py``: ``train`` on the bench's synthetic data
for one model (ResNet-50: 224 px, Adam, the Flowers augmentation; cifar_net: 32 px, SGDM, the
sweep's), stopped in ``TrainProgram.prepare`` once a probe has timed what it wants."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child_command(code: str) -> list:
    """``python -c`` running ``code`` with this folder importable (also under safe-path)."""
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r})\n{code}"]


def stop_in_prepare(model: str, probe, *, num_images: int = 256, execution=None,
                    network=None, options=None) -> None:
    """Call ``train`` until its ``TrainProgram.prepare``, which runs ``probe(program)`` instead.
    ``network``: the module to train (default the bench's ``model``); ``options``: training
    options that replace the bench's."""
    import jaxflowers as jf
    from jaxflowers import bench
    from jaxflowers.training import program as program_lib
    from jaxflowers.training import run as run_lib

    class Reached(Exception):
        pass

    def prepare(self, *args, **kwargs):
        probe(self)
        raise Reached

    spec = bench.scaling.parse_model(model)
    program_lib.TrainProgram.prepare = prepare
    data = bench.scaling.synthetic_set(num_images, spec.image_size, spec.num_classes)
    options = jf.TrainingOptions(solver="adam" if spec.name == "resnet50" else "sgdm",
                                 mini_batch_size=128, augmentation=spec.augmentation,
                                 verbose=False, plots="none", shuffle="every-epoch",
                                 **(options or {}))
    try:
        run_lib.train(data, spec.build() if network is None else network, options,
                      execution=execution)
    except Reached:
        return
    raise RuntimeError("train did not reach TrainProgram.prepare")
