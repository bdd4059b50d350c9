"""figures: a live figure shows once and updates in place in Jupyter or in a window, never
faster than the caller can afford; elsewhere it draws only when saved (or into its file)."""
import io

import matplotlib.image
import pytest

from jaxflowers.plots.backend import LiveFigure, in_jupyter


class Counter(LiveFigure):
    """A live figure drawing one line through the values it was given."""

    def __init__(self, **kwargs):
        self.values, self.draws = [], 0
        super().__init__(figsize=(4, 3), **kwargs)

    def add(self, value):
        self.values.append(value)
        self._changed()

    def _draw(self, fig):
        self.draws += 1
        fig.add_subplot().plot(self.values)


def test_outside_jupyter_it_draws_only_when_saved(tmp_path):
    assert not in_jupyter()
    plot = Counter(min_interval=0)
    for v in range(5):
        plot.add(v)
    assert plot.draws == 0 and plot.figure.axes == []  # no cost per update
    plot.save(tmp_path / "c.png", dpi=20)
    plot.save(tmp_path / "again.png", dpi=20)  # nothing new: not drawn again
    assert plot.draws == 1 and matplotlib.image.imread(tmp_path / "c.png").shape[:2] == (60, 80)


def test_in_jupyter_one_output_updated_in_place_and_throttled(jupyter):
    assert in_jupyter()
    plot = Counter(min_interval=3600)
    assert len(jupyter) == 1  # shown at once, empty, in the creating cell
    image, handle = jupyter[0]
    assert image.format == "png" and image.data.startswith(b"\x89PNG")
    plot.add(1)
    plot.add(2)
    assert handle.updates == []  # throttled
    plot.close()
    assert len(jupyter) == 1 and len(handle.updates) == 1  # the final state, in place
    assert list(plot.figure.axes[0].lines[0].get_ydata()) == [1, 2]
    png = matplotlib.image.imread(io.BytesIO(handle.updates[0].data))
    assert png.shape[:2] == (300, 400)  # figsize (4, 3) at 100 dpi
    plot.add(3)
    assert len(handle.updates) == 1  # closed: no more updates


def test_redraw_pause_grows_with_drawing_time(jupyter):
    """With no minimum interval the pause still grows with the drawing time (4x by default),
    so the caller never spends more than a fifth of its time drawing."""
    plot = Counter(min_interval=0)
    plot.add(1)
    assert jupyter[0][1].updates == []  # the first drawing's cost makes it wait
    plot._draw_share = 1.0  # a pause of 0: every update is drawn
    plot.add(2)
    plot.add(3)
    assert len(jupyter[0][1].updates) == 2


def test_subclass_must_draw():
    with pytest.raises(NotImplementedError):
        LiveFigure(figsize=(1, 1), min_interval=0).save(io.BytesIO())


@pytest.fixture
def window_backend():
    """pyplot on a backend with windows (recorded, not on a screen), Agg again afterwards."""
    import fake_window_backend as fake
    import matplotlib.pyplot as plt

    plt.switch_backend("module://fake_window_backend")
    fake.SHOWN.clear()
    fake.FLUSHED.clear()
    yield fake
    plt.close("all")
    plt.switch_backend("agg")


def test_with_a_display_the_figure_opens_in_a_window_that_updates(window_backend, tmp_path,
                                                                  monkeypatch):
    from test_training_progress import make_info

    from jaxflowers.plots.training_progress import DEFAULT_PATH, TrainingProgressPlot

    monkeypatch.chdir(tmp_path)
    plot = TrainingProgressPlot(max_epochs=3, iterations_per_epoch=4, min_interval=0)
    plot._draw_share = 1.0  # no pause for the drawing's cost: every update is drawn
    assert window_backend.SHOWN == [plot.figure]  # one window, opened at once
    plot.update(make_info(3))
    plot.update(make_info(8))
    figures = [figure for figure, _ in window_backend.FLUSHED]
    assert figures == [plot.figure] * 3 and plot.figure.axes[0].lines[0].get_xdata()[-1] == 8
    assert plot.close(make_info(12)) is None  # no file unasked: the window shows it
    assert not (tmp_path / DEFAULT_PATH).exists() and len(window_backend.FLUSHED) == 4
    assert window_backend.SHOWN == [plot.figure]  # still the one window, left open


def test_a_window_changed_by_another_thread_is_drawn_by_the_main_thread(window_backend):
    import threading

    from jaxflowers.plots.backend import pump_windows, windows_open

    plot = Counter(min_interval=0)
    plot._draw_share = 1.0
    flushed = len(window_backend.FLUSHED)
    worker = threading.Thread(target=plot.add, args=(1,))  # as a pool's reader thread
    worker.start()
    worker.join()
    assert len(window_backend.FLUSHED) == flushed  # GUI toolkits are single-threaded
    assert windows_open()
    pump_windows()  # what a waiting main thread calls
    assert len(window_backend.FLUSHED) == flushed + 1 and plot.draws >= 1
    plot.close()
    assert not windows_open()


def test_a_background_file_is_drawn_while_the_caller_goes_on(tmp_path):
    """A training loop must not wait for its figure: with ``background`` the file is drawn in
    a thread of its own (here held mid-draw), the caller's updates return at once, and
    ``flush`` and ``close`` wait for the newest state to be in the file."""
    import threading

    release = threading.Event()
    release.set()  # the empty frame at creation: drawn by the writer too

    class Held(Counter):
        background = True

        def _draw(self, fig):
            release.wait(60)
            super()._draw(fig)

    path = tmp_path / "live.png"
    plot = Held(min_interval=0, path=path)  # the empty frame, asked of the writer
    plot.flush()
    first, drawn = path.read_bytes(), plot.draws
    release.clear()
    plot.add(1)
    plot._changed(milestone=True)  # a validation: the writer starts drawing, and waits
    plot.add(2)
    plot._changed(milestone=True)  # returned although the writer is still held
    assert path.read_bytes() == first and plot.draws == drawn
    release.set()
    plot.flush()
    assert path.read_bytes() != first and plot.values == [1, 2]
    assert plot.figure.axes[0].lines[0].get_ydata().tolist() == [1, 2]  # the newest state
    plot.close()
    plot._writer.join(10)
    assert not plot._writer.is_alive()  # the writer ends with the figure
