"""figures: a live figure shows once and updates in place in Jupyter, never faster than the
caller can afford; outside Jupyter it draws only when saved."""
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
