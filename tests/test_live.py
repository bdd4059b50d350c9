"""live: what the live plots draw, when they redraw in Jupyter, and the sweep grid."""
import io
import sys
import time
import types

import matplotlib.image
import numpy as np
import pytest

from jaxflowers import live, plots


def make_info(n=12):
    """Stands in for info.TrainingInfo: n iterations of 4 per epoch, validated every 4."""
    it = np.arange(1, n + 1)
    return types.SimpleNamespace(
        iteration=it, epoch=(it - 1) // 4 + 1, loss=2.0 / it,
        accuracy=np.linspace(10.0, 95.0, n), learn_rate=np.full(n, 0.01),
        validation_iteration=np.array([4, 8, 12]), validation_loss=np.array([0.9, 0.5, 0.3]),
        validation_accuracy=np.array([50.0, 80.0, 90.0]))


def assert_png(path, fig, dpi):
    image = matplotlib.image.imread(path)
    width, height = fig.get_size_inches() * dpi
    assert image.shape[:2] == (round(height), round(width))
    assert image[..., :3].std() > 0.01  # something was drawn, not a blank canvas


def test_public_names_stay_reachable_from_plots():
    for name in ("TrainingProgressPlot", "SweepProgressPlot", "sweep_progress"):
        assert getattr(plots, name) is getattr(live, name)
    with pytest.raises(AttributeError, match="no_such_plot"):
        plots.no_such_plot


class FakeMonitor:
    def history(self):
        t = np.arange(5.0)
        return {"time": t, "device": np.array([2, 3]), "utilization": np.stack([t * 10, 90 - t], 1)}


def test_live_progress_outside_jupyter_draws_only_when_saved(tmp_path):
    plot = live.TrainingProgressPlot(monitor=FakeMonitor())
    plot.update(make_info())
    assert plot.figure.axes == []  # nothing drawn yet: no cost per update
    plot.save(tmp_path / "live.png", dpi=30)
    assert_png(tmp_path / "live.png", plot.figure, 30)
    acc, _, gpu = plot.figure.axes
    assert acc.get_title().startswith("Iteration 12")
    np.testing.assert_array_equal(gpu.lines[1].get_ydata(), [90, 89, 88, 87, 86])
    assert [line.get_label() for line in gpu.lines] == ["GPU 2", "GPU 3"]
    plot.close()


@pytest.fixture
def jupyter(monkeypatch):
    """A fake IPython kernel whose display() records what the plots show."""
    shown = []

    class Handle:
        def __init__(self):
            self.updates = []

        def update(self, obj):
            self.updates.append(obj)

    def display(obj, display_id=False):
        assert display_id is True
        shown.append((obj, Handle()))
        return shown[-1][1]

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: types.SimpleNamespace(kernel=object())
    ipython.display = types.ModuleType("IPython.display")
    ipython.display.display = display
    ipython.display.Image = lambda data, format: types.SimpleNamespace(data=data, format=format)
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", ipython.display)
    return shown


def test_live_progress_in_jupyter_updates_one_output_in_place(jupyter):
    plot = live.TrainingProgressPlot(min_interval=3600)
    assert len(jupyter) == 1  # shown at once, empty, in the creating cell
    image, handle = jupyter[0]
    assert image.format == "png" and image.data.startswith(b"\x89PNG")
    plot.update(make_info(4))
    plot.update(make_info(8))
    assert handle.updates == []  # throttled
    plot.close()
    assert len(jupyter) == 1 and len(handle.updates) == 1  # the final state, in place
    assert plot.figure.axes[0].get_title().startswith("Iteration 8")
    png = matplotlib.image.imread(io.BytesIO(handle.updates[0].data))
    assert png.shape[:2] == (700, 800)  # figsize (8, 7) at 100 dpi

    # With no minimum interval the pause still grows with the drawing time (4x by default),
    # so the training loop never spends more than a fifth of its time drawing.
    fast = live.TrainingProgressPlot(min_interval=0)
    fast.update(make_info(2))
    assert len(jupyter) == 2 and jupyter[1][1].updates == []
    fast._draw_share = 1.0  # a pause of 0: every update is drawn
    fast.update(make_info(3))
    assert len(jupyter[1][1].updates) == 1


def message(i, accuracy, **extra):
    return {"iteration": i, "epoch": 1, "loss": 1.0, "accuracy": accuracy,
            "state": "iteration", **extra}


def test_sweep_plot_many_messages_stay_cheap(jupyter, tmp_path):
    plot = live.SweepProgressPlot(2, titles=["depth 1", "depth 2"], min_interval=3600)
    start = time.perf_counter()
    for i in range(1, 4001):
        for job in range(2):
            extra = {"validation_accuracy": 50.0 + job} if i % 1000 == 0 else {}
            plot.update(job, message(i, i / 40, **extra))
    assert time.perf_counter() - start < 2.0  # 8000 messages: appends, no redraw
    handle = jupyter[0][1]
    assert len(jupyter) == 1 and handle.updates == []
    plot.update(0, {"state": "done"})
    assert len(handle.updates) == 1  # a job's end is shown at once
    assert [ax.get_title() for ax in plot.figure.axes] == ["depth 1: done", "depth 2: running"]
    train, val = plot.figure.axes[1].lines
    assert len(train.get_xdata()) == 4000 and train.get_ydata()[-1] == 100.0
    np.testing.assert_array_equal(val.get_xdata(), [1000, 2000, 3000, 4000])
    np.testing.assert_array_equal(val.get_ydata(), [51.0] * 4)
    with pytest.warns(UserWarning, match="ignoring job 7"):
        plot.update(7, message(1, 1.0))


def test_sweep_plot_states_grid_and_errors(tmp_path):
    plot = live.SweepProgressPlot(3, ncols=2)
    plot.update(1, {"state": "failed"})
    plot.update(2, message(1, 5.0))
    plot.update(2, {"state": "cancelled"})
    plot.save(tmp_path / "s.png", dpi=20)
    assert_png(tmp_path / "s.png", plot.figure, 20)
    assert [ax.get_title() for ax in plot.figure.axes[:3]] == [
        "Job 0: queued", "Job 1: failed", "Job 2: cancelled"]
    assert not plot.figure.axes[3].axison  # the unused fourth panel is hidden
    with pytest.raises(ValueError, match="2 titles for 3 jobs"):
        live.SweepProgressPlot(3, titles=["a", "b"])


class FakePool:
    def __init__(self, **attrs):
        self.callbacks = []
        self.__dict__.update(attrs)

    def after_each(self, callback):
        self.callbacks.append(callback)


@pytest.mark.parametrize("pool, kwargs, jobs", [
    (FakePool(futures=[object()] * 3), {}, 3),
    (FakePool(num_jobs=2), {}, 2),
    (FakePool(), {"num_jobs": 4}, 4),
])
def test_sweep_progress_registers_with_the_pool(pool, kwargs, jobs):
    plot = live.sweep_progress(pool, **kwargs)
    assert plot.num_jobs == jobs and len(pool.callbacks) == 1
    pool.callbacks[0](1, message(7, 42.0, validation_accuracy=40.0))
    assert plot.jobs[1].iteration == [7] and plot.jobs[1].accuracy == [42.0]
    assert plot.jobs[1].validation_accuracy == [40.0] and plot.jobs[1].state == "running"


def test_sweep_progress_needs_a_job_count():
    with pytest.raises(ValueError, match="num_jobs"):
        live.sweep_progress(FakePool())


def test_sweep_plot_reads_the_trainers_message_states():
    from jaxflowers.live import SweepProgressPlot

    plot = SweepProgressPlot(1)
    plot.update(0, {"state": "start"})
    assert plot.jobs[0].state == "running"
    plot.update(0, {"state": "iteration", "iteration": 1, "accuracy": 50.0})
    plot.update(0, {"state": "validation", "iteration": 1, "accuracy": 50.0,
                    "validation_accuracy": 40.0})
    assert plot.jobs[0].state == "running"
    plot.update(0, {"state": "done", "iteration": 1, "accuracy": 50.0})
    job = plot.jobs[0]
    assert job.iteration == [1] and job.accuracy == [50.0]  # one training point only
    assert job.validation_iteration == [1] and job.validation_accuracy == [40.0]
    assert job.state == "done"
    plot.close()
