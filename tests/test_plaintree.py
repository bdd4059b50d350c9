"""jaxflowers.saving.plaintree: values as JSON plus arrays, without pickle (sweeps, saved networks)."""
import json

import ml_dtypes
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.saving import plaintree


def test_a_tree_with_arrays_dtypes_and_a_model_comes_back_equal():
    model = jf.models.resnet18(num_classes=3, dtype=ml_dtypes.bfloat16)
    value = {"t": (1, "a", None), "x": np.arange(6, dtype=np.int16).reshape(2, 3),
             "h": np.ones(2, ml_dtypes.bfloat16), "model": model, "dt": np.float32}
    arrays = {}
    tree = json.loads(json.dumps(plaintree.encode_tree(value, arrays, what="test")))
    back = plaintree.rebuild_tagged(plaintree.decode_tree(tree, arrays.__getitem__))
    assert back["t"] == (1, "a", None) and back["dt"] is np.float32
    assert back["x"].dtype == np.int16 and back["x"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["h"].dtype == ml_dtypes.bfloat16
    assert back["model"] == model and back["model"].block_cls is jf.models.BasicBlock


def test_anything_else_is_refused_by_name():
    with pytest.raises(TypeError, match=r"test\['f'\] is a builtins.builtin_function_or_method"):
        plaintree.encode_tree({"f": print}, {}, what="test")
    with pytest.raises(ValueError, match="refusing to rebuild dataclass"):
        plaintree.rebuild_tagged(plaintree.Tagged("dataclass", {"class": "TrainedNet"}))
    with pytest.raises(ValueError, match="refusing to rebuild module 'Popen'"):
        plaintree.rebuild_tagged(plaintree.Tagged("module", {"class": "Popen", "fields": {}}))
