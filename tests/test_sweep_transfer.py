"""jaxflowers.sweep's arguments and results on their way to and from a worker: which objects
travel, how they are rebuilt, and how a job's options are routed.
"""
from __future__ import annotations

import dataclasses
import importlib
import json

import jax
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.sweep import transfer


def test_jaxflowers_objects_travel_and_only_they_are_rebuilt(tmp_path):
    images = np.zeros((4, 8, 8, 3), np.uint8)
    validation = jf.data.ImageSet(images, np.array([0, 1, 0, 1]), ("a", "b"))
    options = jf.TrainingOptions(max_epochs=2, validation_data=validation,
                                 augmentation=jf.data.Augmentation(reflect_x=True))
    model = jf.models.resnet18(num_classes=2, dtype=jax.numpy.bfloat16)
    variables = {"w": jax.numpy.ones(3, jax.numpy.bfloat16), "t": (1, "a", None)}
    arrays = {}
    tree = transfer.encode_tree((options, model, variables), arrays, what="test")
    transfer.write_arguments(tmp_path, {"args": [tree], "kwargs": {}}, arrays)
    back_options, back_model, back_variables = transfer.rebuild(
        transfer.read_arguments(tmp_path))["args"][0]
    assert back_options.max_epochs == 2 and back_options.augmentation == options.augmentation
    assert np.array_equal(back_options.validation_data.images, images)
    assert back_model == model and back_model.block_cls is jf.models.BasicBlock
    assert back_variables["w"].dtype.name == "bfloat16" and back_variables["t"] == (1, "a", None)
    with pytest.raises(TypeError, match="output_fn"):
        transfer.encode_tree(options.replace(output_fn=print), {}, what="test")
    with pytest.raises(TypeError, match=r"test\['f'\] is a builtins.builtin_function_or_method"):
        transfer.encode_tree({"f": print}, {}, what="test")
    with pytest.raises(ValueError, match="refusing to rebuild 'Popen'"):
        transfer.rebuild({"__object__": "Popen", "value": {}})


def test_the_travelling_classes_are_the_public_ones_and_only_they_travel():
    """Classes are named by their modules: a moved or renamed class fails here, and a
    namesake or subclass of a travelling class is refused."""
    public = {"TrainingOptions": jf.TrainingOptions, "ExecutionOptions": jf.ExecutionOptions,
              "ImageSet": jf.data.ImageSet, "TrainedNet": jf.TrainedNet,
              "TrainingInfo": jf.TrainingInfo}
    assert {name: importlib.import_module(module).__dict__[name]
            for name, module in transfer.TRAVELLING.items()} == public
    info = jf.TrainingInfo(*(np.arange(3),) * 8, stop_reason="training loss is NaN",
                           stopped_by=jf.StopReason.DIVERGED)
    net = jf.TrainedNet(jf.models.cifar_net(1, 10), {"params": {"w": np.ones(2)}}, ("a",),
                        (np.zeros(3, np.float32), np.ones(3, np.float32)), (32, 32, 3))
    options = jf.TrainingOptions(learn_rate_schedule=(jf.schedules.Warmup(num_steps=3),
                                                      jf.schedules.Cosine(period=4)))
    for value in (options, info, net, jf.data.digits().subset(np.arange(5))):
        arrays = {}
        tree = json.loads(json.dumps(transfer.encode_tree(value, arrays, what="test")))
        back = transfer.rebuild(transfer.decode_tree(tree, arrays.__getitem__))
        assert type(back) is type(value)
        if value is options:
            assert back == options  # the schedules rebuilt as themselves
        if value is info:
            assert back.diverged and back.stopped_by is jf.StopReason.DIVERGED
    assert back.images.shape == (5, 32, 32, 3)
    namesake = dataclasses.make_dataclass("TrainingInfo", [("loss", float)])
    namesake.__module__ = "jaxflowers.old_info"  # where a stale copy might live
    subclass = type("TrainingInfo", (jf.TrainingInfo,), {"__module__": "tests.elsewhere"})
    for value in (namesake(1.0), subclass(*(np.arange(3),) * 8)):
        with pytest.raises(TypeError, match="cannot travel"):
            transfer.encode_tree(value, {}, what="result")


def test_job_options_route_execution_fields_and_name_what_is_wrong():
    from jaxflowers.sweep.jobs import job_options

    options, execution = job_options({"max_epochs": 2, "steps_per_dispatch": 4,
                                      "augmentation": {"reflect_x": True}},
                                     {"steps_per_dispatch": 1, "precision": "float32"})
    assert options.max_epochs == 2 and options.augmentation == jf.data.Augmentation(True)
    assert execution == jf.ExecutionOptions(steps_per_dispatch=4, precision="float32")
    assert job_options(options, execution) == (options, execution)
    for bad, match in [({"bogus": 1}, "unknown option 'bogus'"),
                       ({"augmentation": {"flip": 1}}, r"augmentation=\{'flip': 1\}"),
                       ({"strategy": "mpi"}, "strategy='mpi' is not allowed")]:
        with pytest.raises(ValueError, match=match):
            job_options(bad)
    with pytest.raises(ValueError, match="unknown execution option 'bogus'"):
        job_options({}, {"bogus": 1})
