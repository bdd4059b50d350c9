"""Ctrl-C during training: stop at the next block boundary and keep the results.

While :func:`catch` is active in the main thread, the first SIGINT only sets a flag (the
training loop stops at its next dispatch and returns what it has); a second SIGINT raises
``KeyboardInterrupt`` as usual, for a user who wants out at once.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading


class Interrupt:
    """Whether Ctrl-C was pressed while training (``requested``)."""

    def __init__(self):
        self.requested = False

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: stopping at the next block boundary (press it again to abort at once)",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def catch():
    """Within the block, Ctrl-C sets ``Interrupt.requested`` instead of raising (main thread
    only; elsewhere the flag simply stays False)."""
    interrupt = Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield interrupt
        return
    previous = signal.signal(signal.SIGINT, interrupt._handle)
    try:
        yield interrupt
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
