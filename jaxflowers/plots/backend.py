"""How a figure reaches the user: inline in Jupyter, a window that updates where pyplot has a
display, else a PNG file rewritten as the run goes; ``pyplot`` and ``LiveFigure`` for the charts.

The lowest plotting module: it imports nothing of jaxflowers but ``host`` and no matplotlib
until needed.
"""
from __future__ import annotations

import io
import math
import os
import pathlib
import threading
import time
import warnings
import weakref

import numpy as np

from jaxflowers.host.files import write_atomic
from jaxflowers.host.terminal import in_jupyter

__all__ = ["BLUE", "RED", "LiveFigure", "has_window", "in_jupyter", "pump_windows", "pyplot",
           "shown", "windows_open"]

# MATLAB's first two line colours: training accuracy (and correct cells), loss (and errors).
BLUE, RED = np.array([0.0, 0.447, 0.741]), np.array([0.85, 0.325, 0.098])
_FILE_BACKENDS = {"agg", "cairo", "pdf", "pgf", "ps", "svg", "template"}
_WINDOWS: weakref.WeakSet = weakref.WeakSet()  # live figures shown in windows, for pump_windows


def shown(text) -> str:
    """``text`` with surrogate escapes (undecodable file-name bytes) shown as ``\\xNN``."""
    return str(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def pyplot():
    """matplotlib.pyplot on matplotlib's own choice of backend (``MPLBACKEND`` or the first
    that works: a window toolkit with a display, else Agg)."""
    import matplotlib.pyplot as plt

    return plt


def has_window() -> bool:
    """Whether pyplot's backend opens windows (not Agg and the like, not Jupyter's inline)."""
    if in_jupyter():
        return False
    backend = pyplot().get_backend().lower()
    return backend not in _FILE_BACKENDS and "inline" not in backend


class LiveFigure:
    """A figure that subclasses draw in ``_draw``, shown as it changes: in place in Jupyter, in
    a window that updates with a display, else rewritten to ``path`` (if given) at milestones.

    Redraws keep at least ``min_interval`` s apart and take at most a fifth of the caller's
    time; a window is redrawn in the main thread only (``pump_windows`` catches up). With
    ``background`` (a subclass whose ``_draw`` reads state that updates replace, never
    mutate) the file is drawn and written in a thread of its own, so the caller, a training
    loop feeding a GPU, never waits for it; ``flush`` waits.
    """

    background = False
    draws_in_place = False  # ``_draw`` updates the artists it made before: no clear first

    def __init__(self, *, figsize, min_interval: float, path=None, layout="constrained"):
        self._lock = threading.RLock()  # updates may come from a pool's reader thread
        self.min_interval, self._jupyter = float(min_interval), in_jupyter()
        self.path = None if path is None else pathlib.Path(os.fspath(path))
        self.window = has_window()
        if self.window:
            self.figure = pyplot().figure(figsize=figsize, layout=layout)
            _WINDOWS.add(self)
        else:
            from matplotlib.figure import Figure  # outside pyplot: nothing left open

            self.figure = Figure(figsize=figsize, layout=layout)
        self._handle, self._last, self._cost = None, -math.inf, 0.0
        # updates taken, the update the figure was last drawn from, the one ``path`` shows
        self._version, self._drawn_version, self._file_version = 0, -1, -1
        self._draw_share = 0.2  # most of the caller's time a redraw may take, on average
        self._file_failed, self._pending = False, False
        self.closed = False
        self._figure_lock = threading.RLock()  # the figure: the caller's or the writer's
        self._queue = threading.Condition()  # background writes asked for and done
        self._asked = self._written = 0
        self._writer: threading.Thread | None = None
        if self._by_writer:
            self._ask_writer()  # the empty frame too: the caller goes on while it is drawn
        else:
            self._changed(force=True)  # show it (empty) where it was created
        if not (self._jupyter or self.window):
            self._cost = 0.0  # writing an empty figure says little of the next files' cost

    @property
    def _by_writer(self) -> bool:
        """The figure goes only to a file, drawn by the writer thread (``background``)."""
        return self.background and self.path is not None and not (self._jupyter or self.window)

    def _draw(self, fig) -> None:
        raise NotImplementedError

    def _changed(self, *, force: bool = False, milestone: bool = False) -> None:
        """Note new data; show it unless the last redraw is within the pause (``force``: now).
        A file is rewritten only when forced or at a ``milestone`` (a validation)."""
        with self._lock:
            self._version += 1
            self._pending = self._pending or milestone  # a file waits for the next chance
            if self.closed or not (self._jupyter or self.window or force or self._pending):
                return
            if self.window and threading.current_thread() is not threading.main_thread():
                return  # GUI toolkits are single-threaded: pump_windows draws it
            # At least min_interval, and drawing takes at most _draw_share of the caller's time.
            pause = max(self.min_interval, self._cost * (1 / self._draw_share - 1))
            if force or time.monotonic() - self._last >= pause:
                self._show(now=force)

    def _redraw(self) -> None:
        with self._figure_lock:
            if self._stale:
                self._drawn_version = self._version  # an update while drawing: stale again
                if not self.draws_in_place:
                    self.figure.clear()
                self._draw(self.figure)

    def _show(self, *, now: bool = False) -> None:
        if self._by_writer and not now:
            self._pending = False
            self._ask_writer()
            return
        start = time.monotonic()
        if self._jupyter:
            self._show_inline()
        elif self.window:
            self._redraw()
            if self.figure.canvas.manager is not None and not self._handle:
                self.figure.show()  # once; pyplot would block on plt.show()
                self._handle = True
            self.figure.canvas.draw_idle()
            self.figure.canvas.flush_events()
        elif self.path is not None:
            self._write(self.path)
        self._pending = False
        self._last = time.monotonic()
        self._cost = self._last - start

    def _ask_writer(self) -> None:
        """Have the writer thread draw the newest state into the file (started once)."""
        with self._queue:
            self._asked += 1
            self._queue.notify_all()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_files, daemon=True,
                                            name="jaxflowers-figure-writer")
            self._writer.start()

    def _write_files(self) -> None:
        """The writer thread: one file per batch of requests, until ``close``."""
        while True:
            with self._queue:
                self._queue.wait_for(lambda: self._asked > self._written or self.closed)
                if self._asked == self._written:
                    return  # closed with nothing asked
                asked = self._asked
            start = time.monotonic()
            self._write(self.path)
            if self._written:  # the first is the empty frame: it says little of the cost
                self._last = time.monotonic()
                self._cost = self._last - start
            with self._queue:
                self._written = asked
                self._queue.notify_all()

    def flush(self) -> None:
        """Wait until the file shows every update asked of it so far (``background``)."""
        with self._queue:
            self._queue.wait_for(lambda: self._written >= self._asked)

    def _show_inline(self) -> None:
        from IPython.display import Image, display

        self._redraw()
        buffer = io.BytesIO()  # why a PNG: any notebook backend shows it, and never twice
        self.figure.savefig(buffer, format="png")
        image = Image(data=buffer.getvalue(), format="png")
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)

    def _write(self, path: pathlib.Path, **savefig_kwargs) -> bool:
        """Rewrite ``path`` whole (a viewer never reads half a file); False, warned once, if
        it cannot be written: a figure never stops what it watches."""
        try:
            with self._figure_lock:
                self._redraw()
                kind = path.suffix.lstrip(".").lower() or "png"
                write_atomic(path, lambda file: self.figure.savefig(file, format=kind,
                                                                    **savefig_kwargs))
                if path == self.path and not savefig_kwargs:
                    self._file_version = self._drawn_version
        except (OSError, ValueError) as error:
            if not self._file_failed:
                reason = getattr(error, "strerror", None) or error
                warnings.warn(f"the figure could not be saved to {path}: {reason}",
                              stacklevel=4)
            self._file_failed = True
            return False
        return True

    @property
    def _stale(self) -> bool:
        """Whether an update came since the figure was last drawn."""
        return self._drawn_version != self._version

    def _file_is_current(self) -> bool:
        """Whether ``path`` already shows every update taken (no need to write it again)."""
        return self._file_version == self._version

    def refresh(self) -> None:
        """Redraw now if new data came and the pause has passed (main thread, for windows)."""
        with self._lock:
            if self._stale and not self.closed and (self._jupyter or self.window):
                self._changed()

    def save(self, path, **savefig_kwargs) -> None:
        """Draw the latest state and write it (PNG, PDF, ... by the file's extension)."""
        self.flush()
        with self._lock, self._figure_lock:
            self._redraw()
            self.figure.savefig(path, **savefig_kwargs)

    def close(self) -> None:
        """Show the final state and stop updating; a window stays open (``plt.show()``
        keeps it on screen after the script's last line)."""
        self.flush()  # the writer's last file, before the final frame
        with self._lock:
            if self._stale and (self._jupyter or self.window) and (
                    not self.window or threading.current_thread() is threading.main_thread()):
                self._show()
            self._handle, self._jupyter, self.closed = None, False, True
            _WINDOWS.discard(self)
        with self._queue:
            self._queue.notify_all()  # the writer, if any, ends


def windows_open() -> bool:
    """Whether a live figure is showing in a window (a waiting caller should pump it)."""
    return any(not figure.closed for figure in _WINDOWS)


def pump_windows() -> None:
    """Redraw the live windows that other threads changed; call from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for figure in list(_WINDOWS):
        figure.refresh()
