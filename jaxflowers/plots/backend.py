"""How a figure reaches the user: the pyplot backend (Agg outside Jupyter), in-place figures.

The lowest plotting module: it imports nothing of jaxflowers and no matplotlib until needed.
"""
from __future__ import annotations

import io
import math
import os
import sys
import threading
import time

import numpy as np

# MATLAB's first two line colours: training accuracy (and correct cells), loss (and errors).
BLUE, RED = np.array([0.0, 0.447, 0.741]), np.array([0.85, 0.325, 0.098])


def shown(text) -> str:
    """``text`` with surrogate escapes (undecodable file-name bytes) shown as ``\\xNN``."""
    return str(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def in_jupyter() -> bool:
    """True inside a Jupyter (IPython kernel) session; never imports IPython itself."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def pyplot():
    """matplotlib.pyplot, on Agg unless in Jupyter or the user has chosen a backend."""
    import matplotlib

    if ("matplotlib.pyplot" not in sys.modules and not in_jupyter()
            and not os.environ.get("MPLBACKEND")):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class LiveFigure:
    """A pyplot-free Figure that subclasses draw in ``_draw``; shown in place in Jupyter only."""

    def __init__(self, *, figsize, min_interval: float):
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=figsize, layout="constrained")
        self._lock = threading.RLock()  # updates may come from a pool's reader thread
        self.min_interval, self._jupyter = float(min_interval), in_jupyter()
        self._handle, self._last, self._cost, self._stale = None, -math.inf, 0.0, True
        self._draw_share = 0.2  # most of the caller's time a redraw may take, on average
        self.closed = False
        self._changed(force=True)  # show it (empty) in the cell that created it

    def _draw(self, fig) -> None:
        raise NotImplementedError

    def _changed(self, *, force: bool = False) -> None:
        """Note new data; in Jupyter redraw unless the last one is within the pause."""
        with self._lock:
            self._stale = True
            # At least min_interval, and drawing takes at most _draw_share of the caller's time.
            pause = max(self.min_interval, self._cost * (1 / self._draw_share - 1))
            if self._jupyter and (force or time.monotonic() - self._last >= pause):
                self._show()

    def _redraw(self) -> None:
        if self._stale:
            self.figure.clear()
            self._draw(self.figure)
            self._stale = False

    def _show(self) -> None:
        from IPython.display import Image, display

        start = time.monotonic()
        self._redraw()
        buffer = io.BytesIO()  # why a PNG: any notebook backend shows it, and never twice
        self.figure.savefig(buffer, format="png")
        image = Image(data=buffer.getvalue(), format="png")
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)
        self._last = time.monotonic()
        self._cost = self._last - start

    def save(self, path, **savefig_kwargs) -> None:
        """Draw the latest state and write it (PNG, PDF, ... by the file's extension)."""
        with self._lock:
            self._redraw()
            self.figure.savefig(path, **savefig_kwargs)

    def close(self) -> None:
        """Show the final state (Jupyter) and stop updating the display."""
        with self._lock:
            if self._jupyter and self._stale:
                self._show()
            self._handle, self._jupyter, self.closed = None, False, True
