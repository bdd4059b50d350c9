"""A matplotlib backend that acts like a window toolkit without a screen: it records what
would be shown and each time the toolkit's events are processed (for the live-window tests)."""
from matplotlib.backend_bases import FigureManagerBase, _Backend
from matplotlib.backends.backend_agg import FigureCanvasAgg

SHOWN: list = []  # figures whose window opened
FLUSHED: list = []  # (figure, number of axes) each time the window processed its events


class FigureManagerFakeWindow(FigureManagerBase):
    def show(self):
        SHOWN.append(self.canvas.figure)


class FigureCanvasFakeWindow(FigureCanvasAgg):
    manager_class = FigureManagerFakeWindow

    def draw_idle(self, *args, **kwargs):
        self.draw()

    def flush_events(self):
        FLUSHED.append((self.figure, len(self.figure.axes)))


@_Backend.export
class _BackendFakeWindow(_Backend):
    FigureCanvas = FigureCanvasFakeWindow
    FigureManager = FigureManagerFakeWindow

    @staticmethod
    def mainloop():
        pass
