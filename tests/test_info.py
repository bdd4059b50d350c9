"""info: TrainingInfo as data (CSV, DataFrame) and its derived fields."""
import csv
import dataclasses
import sys

import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers import TrainingInfo
from jaxflowers.training.info import COLUMNS


def make_info(n=10, every=4):
    """n iterations of 4 per epoch, validated every ``every`` and at the end."""
    it = np.arange(1, n + 1)
    val = np.array(sorted({*range(every, n + 1, every), *([n] if n else [])}), dtype=int)
    return TrainingInfo(
        iteration=it, epoch=(it - 1) // 4 + 1, loss=1.0 / (3.0 * it),
        accuracy=np.linspace(10.0, 95.0, n), learn_rate=np.full(n, 0.01),
        validation_iteration=val, validation_loss=0.1 * val + 1 / 7,
        validation_accuracy=50.0 + val / 3, stop_reason="max-epochs")


def read_csv(path):
    with open(path, newline="") as file:
        return list(csv.reader(file))


def test_to_csv_has_one_row_per_iteration_and_reads_back_exactly(tmp_path):
    info = make_info()
    path = info.to_csv(tmp_path / "metrics.csv")
    rows = read_csv(path)
    assert rows[0] == list(COLUMNS) == ["iteration", "epoch", "loss", "accuracy", "learn_rate",
                                        "validation_loss", "validation_accuracy"]
    body = rows[1:]
    assert len(body) == 10 and [int(r[0]) for r in body] == list(range(1, 11))
    assert [int(r[1]) for r in body] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    np.testing.assert_array_equal([float(r[2]) for r in body], info.loss)  # full precision
    validated = {int(r[0]): (float(r[5]), float(r[6])) for r in body if r[5]}
    assert sorted(validated) == [4, 8, 10]
    assert validated[8] == (info.validation_loss[1], info.validation_accuracy[1])
    assert all(r[5] == r[6] == "" for r in body if int(r[0]) not in validated)


def test_to_csv_of_an_empty_run_is_the_header_only(tmp_path):
    info = make_info(0)
    info.to_csv(tmp_path / "empty.csv")
    assert read_csv(tmp_path / "empty.csv") == [list(COLUMNS)]


def test_to_csv_refuses_an_inconsistent_history(tmp_path):
    info = make_info()
    info.validation_iteration = np.array([4, 8, 11])
    with pytest.raises(ValueError, match=r"validation_iteration \[11\]"):
        info.to_csv(tmp_path / "bad.csv")
    info = make_info()
    info.loss = info.loss[:-1]
    with pytest.raises(ValueError, match="'loss': 9"):
        info.to_csv(tmp_path / "bad.csv")
    assert not (tmp_path / "bad.csv").exists()  # nothing half-written
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        make_info().to_csv(tmp_path / "no_such_folder" / "metrics.csv")


def test_to_dataframe_matches_the_csv(tmp_path):
    import pandas  # in the test extra
    info = make_info()
    frame = info.to_dataframe()
    assert list(frame.columns) == list(COLUMNS) and len(frame) == 10
    assert frame["iteration"].dtype == np.int64
    read = pandas.read_csv(info.to_csv(tmp_path / "m.csv"))
    pandas.testing.assert_frame_equal(frame, read)
    assert frame["validation_accuracy"].notna().sum() == 3


def test_to_dataframe_without_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(ImportError, match=r"needs pandas \(pip install pandas\)"):
        make_info().to_dataframe()


def test_final_values_and_divergence():
    info = make_info()
    assert info.final_validation_accuracy == pytest.approx(50 + 10 / 3)
    assert not info.diverged
    for reason in jf.StopReason:
        assert dataclasses.replace(info, stopped_by=reason).diverged == (
            reason in (jf.StopReason.DIVERGED, jf.StopReason.VALIDATION_DIVERGED))
    assert dataclasses.replace(info, stopped_by="diverged").stopped_by is jf.StopReason.DIVERGED


def test_repr_is_one_short_line_however_long_the_run():
    """A notebook that ends a cell with ``info`` (or ``net``) shows a summary, not arrays."""
    from test_saving import tiny_net

    info = make_info(n=5000)
    text = repr(info)
    assert text == ("TrainingInfo(5000 iterations, 1250 validations, final validation accuracy "
                    f"{info.final_validation_accuracy:.2f}%, stop_reason={info.stop_reason!r})")
    assert len(repr(tiny_net())) < 100 and "\n" not in repr(tiny_net())
