"""Where the user watches: a terminal, a Jupyter kernel or a log file; progress bars for each.

A bar redraws itself with carriage returns, which a terminal or a notebook shows as one line
but a redirected log keeps as runs of ``\\r``: bars run on terminals and in Jupyter only.
"""
from __future__ import annotations

import sys
import time

__all__ = ["in_jupyter", "is_terminal", "progress_bar"]


def in_jupyter() -> bool:
    """True inside a Jupyter (IPython kernel) session; never imports IPython itself."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def is_terminal(stream) -> bool:
    """Whether ``stream`` is a terminal (False for files, pipes and closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def progress_bar(total: int, *, desc: str, unit: str, initial: int = 0, file=None,
                 log_when_done: bool = False, **kwargs):
    """A ``tqdm`` bar with rate and ETA on ``file`` (default stderr); disabled (silent, still
    usable) unless ``file`` is a terminal or this is a Jupyter kernel.

    Args:
      total: the count at completion. desc: the label before the bar. unit: what is counted.
      initial: the count already done (a resumed run).
      log_when_done: where the bar is disabled, one line ``desc: done in S s`` on close (or
        ``desc: N of TOTAL unit in S s`` when it stopped short).
      **kwargs: more ``tqdm`` arguments.
    """
    from tqdm import tqdm

    class Bar(tqdm):
        def update(self, n=1):
            self.counted += n
            return super().update(n)

        def close(self):
            if self.disable and log_when_done and not self.logged:
                self.logged = True
                done = ("done" if self.counted + initial >= total
                        else f"{self.counted + initial:,} of {total:,} {unit}")
                print(f"{desc}: {done} in {time.monotonic() - start:.1f} s", file=file,
                      flush=True)
            super().close()

    file, start = sys.stderr if file is None else file, time.monotonic()
    Bar.counted, Bar.logged = 0, False  # per bar: the class is made per call
    return Bar(total=total, desc=desc, unit=unit, initial=initial, file=file,
               disable=not (is_terminal(file) or in_jupyter()), dynamic_ncols=True, **kwargs)
