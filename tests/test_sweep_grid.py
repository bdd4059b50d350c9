"""live: the sweep grid, what it draws and when it redraws in Jupyter."""
import io

import matplotlib.image
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from jaxflowers import plots
from jaxflowers import plots as live


def assert_png(path, fig, dpi):
    image = matplotlib.image.imread(path)
    width, height = fig.get_size_inches() * dpi
    assert image.shape[:2] == (round(height), round(width))
    assert image[..., :3].std() > 0.01  # something was drawn, not a blank canvas


def test_public_names_stay_reachable_from_plots():
    for name in ("SweepProgressPlot", "sweep_progress"):
        assert getattr(plots, name) is getattr(live, name)
    with pytest.raises(AttributeError, match="no_such_plot"):
        plots.no_such_plot


def message(i, accuracy, **extra):
    return {"iteration": i, "epoch": 1, "loss": 1.0, "accuracy": accuracy,
            "state": "iteration", **extra}


def titles(plot) -> list[str]:
    """Each job's title: its name and state."""
    return [cell.get_suptitle() for cell in plot.figure.subfigs if cell.get_suptitle()]


def test_sweep_plot_many_messages_stay_cheap(jupyter, tmp_path):
    plot = live.SweepProgressPlot(2, titles=["depth 1", "depth 2"], min_interval=3600)
    draws, draw = [], plot._draw
    plot._draw = lambda fig: (draws.append(fig), draw(fig))
    for i in range(1, 4001):
        for job in range(2):
            extra = {"validation_accuracy": 50.0 + job} if i % 1000 == 0 else {}
            plot.update(job, message(i, i / 40, **extra))
    assert draws == []  # 8000 messages, validations among them: appends, no redraw
    handle = jupyter[0][1]
    assert len(jupyter) == 1 and handle.updates == []
    plot.update(0, {"state": "done"})
    assert len(draws) == 1 and len(handle.updates) == 1  # a job's end is shown at once
    assert titles(plot) == ["depth 1: done", "depth 2: running"]
    train, val = plot.figure.axes[2].lines  # job 1's accuracy, above its loss
    assert train.get_xdata()[[0, -1]].tolist() == [1, 4000] and train.get_ydata()[-1] == 100.0
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
    assert titles(plot) == ["Job 0: queued", "Job 1: failed", "Job 2: cancelled"]
    assert len(plot.figure.axes) == 6  # accuracy and loss of 3 jobs; the fourth cell empty
    (legend,) = plot.figure.legends  # one legend for the figure, outside every panel
    assert [t.get_text() for t in legend.get_texts()] == ["Training accuracy", "Training loss",
                                                         "Validation"]
    assert not any(ax.get_legend() for ax in plot.figure.axes)
    assert plot.figure.get_suptitle() == "Training progress of 3 networks"
    with pytest.raises(ValueError, match="2 titles for 3 jobs"):
        live.SweepProgressPlot(3, titles=["a", "b"])


def test_loss_beside_accuracy_epochs_shaded_and_headroom_at_100_percent():
    plot = live.SweepProgressPlot(1)
    for i in range(1, 13):
        plot.update(0, message(i, 100.0, epoch=(i - 1) // 4 + 1, loss=1.0 / i))
    plot.update(0, message(12, 100.0, state="validation", validation_accuracy=100.0,
                           validation_loss=0.2))
    plot.save(io.BytesIO())
    acc, loss = plot.figure.axes
    np.testing.assert_allclose(loss.lines[0].get_ydata(), 1.0 / np.arange(1, 13))
    assert loss.lines[1].get_xydata().tolist() == [[12, 0.2]]
    assert acc.get_ylim()[1] > 100  # a line at 100 % is not drawn on the frame
    shaded = [p for p in acc.patches if p.get_gid() == "epoch"]
    assert [p.get_x() for p in shaded] == [4.5]  # epoch 2 of 3
    assert all(float(t).is_integer() for t in loss.get_xticks())


def test_a_long_noisy_line_is_drawn_by_its_envelope_first_last_and_extremes_kept():
    """Past four points per run of the drawing's resolution, each run keeps its first, lowest,
    highest and last point, in order; a short line is drawn whole."""
    plot = live.SweepProgressPlot(1)
    rng = np.random.default_rng(0)
    accuracy = rng.uniform(0, 100, 9360)
    accuracy[[17, 5000]] = [100.0, np.nan]  # the top of the line, and a gap
    for i, value in enumerate(accuracy, 1):
        plot.update(0, message(i, value, loss=float(i)))
    plot.save(io.BytesIO())
    train = plot.figure.axes[0].lines[0]  # no validation: the training line alone
    x, y = train.get_xdata(), train.get_ydata()
    assert len(x) < len(accuracy) / 2 and np.all(np.diff(x) > 0)
    assert x[0] == 1 and x[-1] == 9360 and np.nanmax(y) == 100.0
    assert np.nanmin(y) == np.nanmin(accuracy)
    np.testing.assert_array_equal(y, accuracy[x.astype(int) - 1])  # points of the line itself
    short = live.SweepProgressPlot(1)
    for i in range(1, 101):
        short.update(0, message(i, float(i % 7)))
    short.save(io.BytesIO())
    assert len(short.figure.axes[0].lines[0].get_xdata()) == 100


def test_a_long_line_of_no_numbers_at_all_is_drawn_without_error():
    """A line whose every point is NaN (no run has an extreme) keeps each run's first and
    last point and the redraw goes on."""
    plot = live.SweepProgressPlot(1)
    for i in range(1, 3001):
        plot.update(0, message(i, float("nan"), loss=float("nan")))
    plot.save(io.BytesIO())
    x = plot.figure.axes[0].lines[0].get_xdata()
    assert 0 < len(x) < 3000 and x[0] == 1 and x[-1] == 3000


def test_the_grid_keeps_its_titles_axes_and_legend_apart(tmp_path):
    """Laid out by fixed margins: the titles, each axis's tick labels and label, and the
    legend lie inside the figure and apart, for a grid of 4 and a single cell."""
    for jobs in (4, 1):
        plot = live.SweepProgressPlot(jobs, titles=[f"depth {d}" for d in range(1, jobs + 1)])
        for job in range(jobs):
            for i in range(1, 40):
                plot.update(job, message(i, 50.0 + job, loss=2.5 / i,
                                         validation_accuracy=40.0 if i % 10 == 0 else None))
        plot.save(tmp_path / "grid.png")
        figure = plot.figure
        renderer = FigureCanvasAgg(figure).get_renderer()
        figure.draw(renderer)
        boxes = {"title": figure._suptitle.get_window_extent(renderer),
                 "legend": figure.legends[0].get_window_extent(renderer)}
        for k, cell in enumerate(figure.subfigs):
            boxes[f"cell {k} title"] = cell._suptitle.get_window_extent(renderer)
        for k, ax in enumerate(figure.axes):
            for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
                box = axis.get_tightbbox(renderer)
                if box is not None and box.width and box.height:
                    boxes[f"axes {k} {name}"] = box
        assert len(boxes) == 2 + jobs + 3 * jobs  # the upper axes' x axis has no labels
        names = list(boxes)
        for i, name in enumerate(names):
            box = boxes[name]
            assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1 + 0.5, name
            assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1 + 0.5, name
            for other in names[i + 1:]:
                same_axes = name.split()[:2] == other.split()[:2] and name.startswith("axes")
                assert same_axes or not box.overlaps(boxes[other]), f"{name} overlaps {other}"


def test_without_a_display_the_file_follows_validations_and_job_ends(tmp_path):
    path = tmp_path / "grid.png"
    plot = live.SweepProgressPlot(2, path=path, min_interval=0)
    empty = path.read_bytes()
    plot.update(0, message(1, 10.0))
    assert path.read_bytes() == empty  # an iteration: not rewritten
    plot.update(0, message(1, 10.0, state="validation", validation_accuracy=20.0))
    validated = path.read_bytes()
    assert validated != empty
    plot.update(1, {"state": "failed"})
    assert path.read_bytes() != validated  # a job's end
    assert plot.close() == path and titles(plot)[1] == "Job 1: failed"


def test_close_writes_the_file_only_if_an_update_is_not_in_it_yet(tmp_path):
    path = tmp_path / "grid.png"
    plot = live.SweepProgressPlot(2, path=path, min_interval=0)
    plot.update(0, {"state": "done"})
    plot.update(1, {"state": "done"})  # the last job's end: drawn and written at once
    written = path.stat()
    assert plot.close() == path
    assert path.stat().st_ino == written.st_ino  # the same file, not written again
    assert titles(plot) == ["Job 0: done", "Job 1: done"]

    plot = live.SweepProgressPlot(1, path=path, min_interval=0)
    plot.update(0, message(1, 10.0, validation_accuracy=20.0))  # a validation: written
    plot.update(0, message(2, 30.0))  # an iteration: taken, not written
    written = path.stat()
    assert plot.close() == path
    assert path.stat().st_ino != written.st_ino  # the final state written
    train = plot.figure.axes[0].lines[0]
    np.testing.assert_array_equal(train.get_xdata(), [1, 2])


def grid_png(plot) -> np.ndarray:
    buffer = io.BytesIO()
    plot.save(buffer, format="png", dpi=50)
    buffer.seek(0)
    return matplotlib.image.imread(buffer)


def test_a_grid_redrawn_in_place_shows_what_one_drawn_once_does():
    """Each redraw updates the cells' artists: after many redraws (epochs shaded as they come,
    a panel reused for the next trial, jobs ending) the picture and the artists are those of
    a grid drawn once from the same messages."""
    rng = np.random.default_rng(0)
    messages = []
    for i in range(1, 1301):  # job 0 validates every 100 iterations, job 2 never
        for job, per_epoch in ((0, 100), (1, 130), (2, 70)):
            if job == 1 and i > 900:
                continue
            extra = {"validation_accuracy": 50 + i / 100, "validation_loss": 2 - i / 1000} \
                if job == 0 and i % 100 == 0 else {}
            messages.append((job, message(i, float(rng.uniform(0, 100)), loss=float(rng.random()),
                                          epoch=(i - 1) // per_epoch + 1, **extra)))
    messages.insert(len(messages) // 2, ("reuse", 1))
    messages += [(0, {"state": "done"}), (1, {"state": "failed"})]

    def feed(plot, redraw_every):
        for k, (job, what) in enumerate(messages):
            if job == "reuse":
                plot.reuse(what, "trial 7")
            else:
                plot.update(job, what)
            if redraw_every and k % redraw_every == 0:
                grid_png(plot)
        return plot

    kwargs = dict(titles=["a", "b", "c"], min_interval=3600)
    often = feed(live.SweepProgressPlot(3, **kwargs), redraw_every=251)
    once = feed(live.SweepProgressPlot(3, **kwargs), redraw_every=None)
    first, second = grid_png(often), grid_png(once)
    # the same up to rounding: the shading's limits pass through the axes' transforms
    assert np.abs(first - second).max() <= 2 / 255
    assert np.count_nonzero(np.abs(first - second).max(-1)) <= 10
    assert titles(often) == titles(once) == ["a: done", "trial 7: failed", "c: running"]
    for a, b in zip(often.figure.axes, once.figure.axes):
        assert len(a.patches) == len(b.patches)  # no epoch shaded twice or left over
        assert [p.get_x() for p in a.patches] == [p.get_x() for p in b.patches]
        for line, same in zip(a.lines, b.lines, strict=True):
            np.testing.assert_array_equal(line.get_xydata(), same.get_xydata())
        np.testing.assert_allclose(a.get_xlim(), b.get_xlim())
        np.testing.assert_allclose(a.get_ylim(), b.get_ylim())
    epochs_of_c = len(often.figure.axes[4].patches)
    assert epochs_of_c == 9  # 1,300 iterations of 70: epochs 2, 4, ..., 18 shaded


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
    from jaxflowers.plots.sweep_grid import SweepProgressPlot

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
    plot.update(0, {"state": "failed"})
    plot.update(5, {"state": "cancelled"})  # a later job: no warning, nothing changed
    assert job.state == "done" and plot.closed
