"""SIGINT (Ctrl-C) and SIGTERM (``kill``, Slurm's time limit, Kubernetes) while a run works.

Under :func:`catch` the first signal is only recorded (the loop stops at its next block
boundary); a second raises at once: ``KeyboardInterrupt``, or its subclass ``Terminated``.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

__all__ = ["EXIT_STATUS", "Interrupt", "SIGNALS", "Terminated", "catch", "exit_status", "raise_for",
           "signal_words", "sigterm_raises"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal number


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would raise ``KeyboardInterrupt``."""


def raise_for(signum: int) -> None:
    """Raise the exception that stands for ``signum`` in the main thread."""
    raise Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt


@contextlib.contextmanager
def sigterm_raises():
    """Within the block SIGTERM raises ``Terminated`` (unless the caller has a handler)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: raise_for(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def signal_words(error: BaseException, *, capital: bool = False) -> str:
    """How a stop by ``error`` (``KeyboardInterrupt`` or ``Terminated``) is said."""
    words = "terminated (SIGTERM)" if isinstance(error, Terminated) else "interrupted"
    return words[0].upper() + words[1:] if capital else words


def exit_status(error: BaseException) -> int:
    """130 for ``KeyboardInterrupt``, 143 for ``Terminated``."""
    return EXIT_STATUS[signal.SIGTERM if isinstance(error, Terminated) else signal.SIGINT]


class Interrupt:
    """Which stop signal arrived while training (``signal``: None, SIGINT or SIGTERM)."""

    def __init__(self):
        self.signal: int | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:
            raise_for(signum)
        self.signal = signum
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        print(f"\n{name}: stopping at the next block boundary (again to stop at once)",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def catch():
    """Within the block SIGINT and SIGTERM set ``Interrupt.signal`` (main thread only)."""
    interrupt = Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield interrupt
        return
    previous = {signum: signal.signal(signum, interrupt._handle) for signum in SIGNALS}
    try:
        yield interrupt
    finally:
        for signum, handler in previous.items():
            if handler is None:  # installed outside Python: the interpreter's own default
                handler = (signal.default_int_handler if signum == signal.SIGINT
                           else signal.SIG_DFL)
            signal.signal(signum, handler)
