"""progress_plot: the training-progress view draws what MATLAB's window shows, its final
frame is the finished info, and it is saved where the user can find it."""
import dataclasses
import io
import pathlib
import re

import matplotlib
import matplotlib.image
import numpy as np
import pytest
from PIL import Image

from jaxflowers import TrainingInfo, plots
from jaxflowers.plots.training_progress import DEFAULT_PATH, TrainingProgressPlot, training_progress


def make_info(n=12, **changes):
    """n iterations of 4 per epoch, validated every 4."""
    it = np.arange(1, n + 1)
    val = np.arange(4, n + 1, 4)
    info = TrainingInfo(
        iteration=it, epoch=(it - 1) // 4 + 1, loss=2.0 / it,
        accuracy=np.linspace(10.0, 95.0, n), learn_rate=np.full(n, 0.01),
        validation_iteration=val, validation_loss=1.0 / val,
        validation_accuracy=50.0 + val, train_time=83.0, num_devices=4,
        stop_reason="max-epochs", max_epochs=3, iterations_per_epoch=4)
    return dataclasses.replace(info, **changes)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def panel_text(fig) -> dict:
    """{label: value} of the information panel."""
    (info_ax,) = [ax for ax in fig.axes if ax.get_gid() == "information"]
    return {t.get_gid(): t.get_text() for t in info_ax.texts if t.get_gid()}


def epoch_axis(ax):
    (top,) = [child for child in ax.child_axes if child.get_gid() == "epochs"]
    return top.get_xticks().tolist(), [t.get_text() for t in top.get_xticklabels()]


def test_public_names_are_reachable_from_plots():
    assert plots.TrainingProgressPlot is TrainingProgressPlot
    assert plots.training_progress is training_progress


def test_panels_lines_legends_and_epochs(tmp_path):
    info = make_info()
    fig = training_progress(info, smoothing=0.5)
    acc, loss, _ = fig.axes
    raw, smooth, val = acc.lines
    np.testing.assert_array_equal(raw.get_xdata(), info.iteration)
    np.testing.assert_array_equal(raw.get_ydata(), info.accuracy)
    np.testing.assert_array_equal(loss.lines[0].get_ydata(), info.loss)
    # Bias-corrected moving average with weight 0.5 of 10, 10 + 85/11, ...
    a = info.accuracy
    np.testing.assert_allclose(smooth.get_ydata()[:2], [a[0], (0.25 * a[0] + 0.5 * a[1]) / 0.75])
    np.testing.assert_array_equal(val.get_xdata(), [4, 8, 12])
    np.testing.assert_array_equal(val.get_ydata(), [54.0, 58.0, 62.0])
    np.testing.assert_array_equal(loss.lines[2].get_ydata(), [0.25, 0.125, 1 / 12])
    for ax in (acc, loss):  # legends on both panels
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["Training", "Training (smoothed)", "Validation"]
        shaded = [p for p in ax.patches if p.get_gid() == "epoch"]
        assert [p.get_x() for p in shaded] == [4.5]  # epoch 2 of 3 shaded
    assert epoch_axis(acc) == ([2.5, 6.5, 10.5], ["1", "2", "3"])
    ticks = loss.get_xticks()
    assert all(float(t).is_integer() for t in ticks)  # iterations are whole numbers
    assert acc.get_ylim()[1] > 100 and acc.get_yticks()[-1] == 100  # 100 % off the frame
    text = panel_text(fig)
    assert text["Epoch"] == "3 of 3" and text["Iteration"] == "12 of 12"  # from the info
    assert text["Accuracy"] == "62.00%" and text["Loss"] == "0.0833"
    assert text["Elapsed"] == "00:01:23" and text["Hardware"] == "4 devices"
    assert text["Stop reason"] == "max-epochs" and text["Learning rate"] == "0.01"
    assert text["Final validation"] == "62.00%"  # the last validation unless the info says
    fig.savefig(tmp_path / "tp.png", dpi=40)
    assert matplotlib.image.imread(tmp_path / "tp.png")[..., :3].std() > 0.01


def test_a_panel_per_requested_metric_and_one_device_in_words():
    info = make_info(validation_metrics={"fscore": np.array([0.2, 0.5, 0.9]),
                                         "auc": np.array([0.6, 0.7, 0.8])}, num_devices=1)
    fig = training_progress(info)
    acc, loss, fscore, auc, _ = fig.axes
    assert (fscore.get_ylabel(), auc.get_ylabel()) == ("F-score", "AUC")
    np.testing.assert_array_equal(fscore.lines[0].get_xydata(), [[4, 0.2], [8, 0.5], [12, 0.9]])
    assert auc.get_xlabel() == "Iteration" and loss.get_xlabel() == ""  # the bottom panel's
    assert panel_text(fig)["Hardware"] == "1 device"
    assert fig.get_size_inches()[1] > training_progress(make_info()).get_size_inches()[1]


def test_the_returned_networks_validation_is_shown_beside_the_last_in_training():
    """The returned network (batch norm finalised, or the best one) scores apart from the
    last validation during training; the finished frame shows both."""
    text = panel_text(training_progress(make_info(final_validation_accuracy=71.25)))
    assert text["Accuracy"] == "62.00%" and text["Final validation"] == "71.25%"


def test_into_given_axes_and_empty_info():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    assert training_progress({"iteration": [], "loss": None}, ax=axes) is fig
    assert len(fig.axes) == 2 and axes[0].lines[0].get_xdata().size == 0


def test_many_epochs_are_shaded_and_labelled_every_tenth(tmp_path):
    plot = TrainingProgressPlot(max_epochs=80, iterations_per_epoch=3, path=tmp_path / "p.png")
    plot.update(make_info(30))
    plot.save(io.BytesIO())
    acc, loss, _ = plot.figure.axes
    assert acc.get_xlim() == (0.5, 240.5)  # the whole run from the start, as MATLAB's
    assert len([p for p in loss.patches if p.get_gid() == "epoch"]) == 40
    ticks, labels = epoch_axis(acc)
    assert labels == [str(e) for e in range(10, 81, 10)] and ticks[0] == 29.0  # epoch 10: 27.5-30.5
    text = panel_text(plot.figure)
    assert text["Epoch"] == "8 of 80" and text["Iteration"] == "30 of 240"
    assert text["Stop reason"] == "training"  # still running: no reason yet


def test_without_a_display_the_file_is_rewritten_at_each_validation(tmp_path, monkeypatch,
                                                                     capsys):
    """A script on a machine without a display: the PNG in the working folder shows the run
    so far after each validation (not after every update), and the final frame at close."""
    monkeypatch.chdir(tmp_path)
    plot = TrainingProgressPlot(max_epochs=3, iterations_per_epoch=4, validation_frequency=4,
                                hardware="4 x cpu", min_interval=0)
    path = tmp_path / DEFAULT_PATH
    plot.flush()  # the empty frame, written beside the caller, can be opened while training
    empty = path.read_bytes()
    plot.update(make_info(3))  # no validation yet: the file stays as it was
    plot.flush()
    assert path.read_bytes() == empty
    plot.update(make_info(4))  # the first validation: rewritten (in the writer thread)
    plot.flush()
    first = path.read_bytes()
    assert first != empty and Image.open(path).size == (1100, 600)
    acc = plot.figure.axes[0]
    assert acc.lines[0].get_xdata()[-1] == 4 and acc.lines[2].get_xdata().tolist() == [4]
    plot.update(make_info(7))
    plot.flush()
    assert path.read_bytes() == first  # between validations: not rewritten
    final = make_info(12, stop_reason="stopped by output_fn")
    assert plot.close(final) == pathlib.Path(DEFAULT_PATH)  # relative to the working folder
    out = capsys.readouterr().out
    assert out == f"Training progress plot saved to {tmp_path / DEFAULT_PATH}\n"
    acc, loss, _ = plot.figure.axes
    assert acc.lines[0].get_xdata()[-1] == 12 and loss.lines[2].get_xdata()[-1] == 12
    text = panel_text(plot.figure)
    assert text["Iteration"] == "12 of 12" and text["Epoch"] == "3 of 3"
    assert text["Frequency"] == "every 4 iterations" and text["Hardware"] == "4 x cpu"
    assert text["Stop reason"] == "stopped by output_fn"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text["Start time"])
    with Image.open(tmp_path / DEFAULT_PATH) as png:  # what the figure says, as text
        assert png.size == (1100, 600)
        description = png.text["Description"]
    assert "Iteration: 12 of 12" in description and "Accuracy: 62.00%" in description


def test_jupyter_close_shows_the_final_frame_and_saves_only_when_asked(jupyter, tmp_path,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    plot = TrainingProgressPlot(min_interval=3600, max_epochs=3, iterations_per_epoch=4)
    plot.update(make_info(4))
    plot.update(make_info(8))
    (_, handle), = jupyter
    assert handle.updates == []  # throttled: the live view still shows the start
    assert plot.close(make_info(12)) is None and not (tmp_path / DEFAULT_PATH).exists()
    assert len(handle.updates) == 1  # the last frame replaced it, in place
    assert plot.figure.axes[0].lines[0].get_xdata()[-1] == 12
    png = matplotlib.image.imread(io.BytesIO(handle.updates[0].data))
    assert png.shape[:2] == (600, 1100)
    asked = TrainingProgressPlot(path=tmp_path / "run" / "progress.pdf")
    assert asked.close(make_info(4)) == tmp_path / "run" / "progress.pdf"
    assert (tmp_path / "run" / "progress.pdf").read_bytes()[:4] == b"%PDF"


def test_a_path_that_cannot_be_written_warns_and_keeps_going(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.warns(UserWarning, match="could not be saved to .*file/progress.png") as seen:
        plot = TrainingProgressPlot(path=tmp_path / "file" / "progress.png", min_interval=0)
        plot.update(make_info(4))
        assert plot.close(make_info()) is None
    assert len(seen) == 1  # said once, not at every validation


class FakeMonitor:
    def history(self):
        t = np.arange(5.0)
        return {"time": t, "device": np.array([2, 3]), "utilization": np.stack([t * 10, 90 - t], 1)}


def test_gpu_panel_from_a_monitor(tmp_path):
    plot = TrainingProgressPlot(monitor=FakeMonitor(), path=tmp_path / "gpu.png")
    plot.close(make_info())
    *_, gpu = plot.figure.axes
    np.testing.assert_array_equal(gpu.lines[1].get_ydata(), [90, 89, 88, 87, 86])
    assert [line.get_label() for line in gpu.lines] == ["GPU 2", "GPU 3"]


def test_the_view_keeps_its_title_axes_legends_and_information_apart(tmp_path):
    """Laid out by fixed margins: the title, each panel's tick labels and labels, the epochs'
    axis, the legends and every line of the information panel lie inside the figure and
    apart, with metric and GPU panels and with a hardware name too long for the usual panel
    (which then widens and the panels narrow)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    info = make_info(validation_metrics={"fscore": np.array([0.2, 0.5, 0.9])},
                     loss=np.geomspace(2.0, 2e-4, 12))
    widths = {}
    for name, hardware, monitor, metrics in (
            ("plain", "1 x NVIDIA H200 (shard_map)", None, ()),
            ("long", "8 x NVIDIA GeForce RTX 4090 Laptop GPU (shard_map)", FakeMonitor(),
             ("fscore",))):
        plot = TrainingProgressPlot(path=tmp_path / f"{name}.png", hardware=hardware,
                                    monitor=monitor, metrics=metrics, max_epochs=3,
                                    iterations_per_epoch=4, validation_frequency=4)
        plot.close(info)
        figure = plot.figure
        renderer = FigureCanvasAgg(figure).get_renderer()
        figure.draw(renderer)
        boxes = {"title": figure._suptitle.get_window_extent(renderer)}
        panels = [ax for ax in figure.axes if ax.get_gid() != "information"]
        (panel,) = [ax for ax in figure.axes if ax.get_gid() == "information"]
        for k, ax in enumerate(panels):
            boxes[f"axes {k} frame"] = ax.get_window_extent(renderer)
            for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
                box = axis.get_tightbbox(renderer)
                if box is not None and box.width and box.height:
                    boxes[f"axes {k} {axis_name}"] = box
            if ax.get_legend() is not None:
                boxes[f"axes {k} legend"] = ax.get_legend().get_window_extent(renderer)
            for child in ax.child_axes:  # the epochs' axis on top
                boxes[f"axes {k} epochs"] = child.xaxis.get_tightbbox(renderer)
        for k, text in enumerate(panel.texts):
            boxes[f"information {k}"] = text.get_window_extent(renderer)
        assert any(t.get_text() == hardware for t in panel.texts)
        names = list(boxes)
        for i, box_name in enumerate(names):
            box = boxes[box_name]
            assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1 + 0.5, (name, box_name)
            assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1 + 0.5, (name, box_name)
            for other in names[i + 1:]:
                same = box_name.split()[:2] == other.split()[:2] and box_name.startswith("axes")
                assert same or not box.overlaps(boxes[other]), \
                    f"{name}: {box_name} overlaps {other}"
        widths[name] = panels[0].get_position().width
    assert widths["long"] < widths["plain"]  # the panels gave the long name room


SCRIPT = """
import jaxflowers as jf

train_set, test_set = jf.data.digits().split_each_label(0.9, seed=0)
# The network as trained at the last iteration, so its final scores are the last
# validation's (by default train returns the best validation's, with population statistics).
opts = jf.TrainingOptions(max_epochs=1, mini_batch_size=64, validation_data=test_set,
                          validation_frequency=10, plots="training-progress", log_dir="tb",
                          output_network="last-iteration", batch_normalization_statistics="moving")
net, info = jf.train(train_set, jf.models.cifar_net(depth=1, num_classes=10), opts)
info.to_csv("metrics.csv")
print("FINAL", info.iteration[-1], f"{info.final_validation_accuracy:.2f}%")
print("STOP", info.stop_reason)
"""


@pytest.mark.slow
def test_a_script_leaves_the_final_frame_the_csv_and_the_event_file(tmp_path):
    """What a user running a script gets: one line saying where the figure went, and a
    figure, a CSV and TensorBoard scalars that all end at the info's last iteration."""
    import csv
    import os
    import subprocess
    import sys

    from test_tensorboard import read_scalars

    root = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # as a user's shell
    env["PYTHONPATH"] = str(root)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _, iterations, accuracy = re.search(r"^FINAL (\d+) (.+)$", done.stdout, re.M).group(0).split()
    assert iterations == "25"  # 1,617 training images, 64 a batch: 25 iterations an epoch
    saved = [line for line in done.stdout.splitlines() if "training_progress" in line]
    assert saved == [f"Training progress plot saved to {tmp_path / DEFAULT_PATH}"]
    with Image.open(tmp_path / DEFAULT_PATH) as png:
        description = png.text["Description"]
    assert f"Iteration: {iterations} of {iterations}" in description
    reason = re.search(r"^STOP (.+)$", done.stdout, re.M).group(1)
    assert f"Accuracy: {accuracy}" in description and f"Stop reason: {reason}" in description
    with open(tmp_path / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 25 and rows[-1]["iteration"] == iterations
    assert [r["iteration"] for r in rows if r["validation_accuracy"]] == ["10", "20", "25"]
    scalars = read_scalars(tmp_path / "tb")
    assert [step for step, _ in scalars["training/loss"]] == list(range(1, 26))
    assert f"{scalars['validation/accuracy'][-1][1]:.2f}%" == accuracy
