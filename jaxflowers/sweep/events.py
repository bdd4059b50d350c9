"""The pool's event thread: ``after_each`` callbacks, then the futures' completion.

A future completes only after its job's earlier messages, so ``fetch_outputs`` sees them all.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Iterable

__all__ = ["MESSAGE_STATES", "EventDispatcher", "OnlyStates", "Relay"]

# The "state" of the messages train_job sends (train's output_fn) and the pool adds.
MESSAGE_STATES = ("start", "iteration", "validation", "done", "failed", "cancelled")

_log = logging.getLogger(__name__)


class EventDispatcher:
    """The thread that runs the ``after_each`` callbacks, then completes the futures."""

    def __init__(self):
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._callbacks: list[Callable] = []
        self._backlog: list[tuple[int, dict]] = []
        self._completed: set[int] = set()  # jobs whose end was dispatched (each once)
        self._thread = threading.Thread(target=self._run, name="sweep-events", daemon=True)
        self._thread.start()

    def add_callback(self, callback: Callable) -> None:
        """Register ``callback(job_index, message)``; it first receives the backlog."""
        self._items.put(("callback", callback))

    def put(self, job_index: int, message: dict) -> None:
        self._items.put(("message", (job_index, message)))

    def complete(self, job, value: Any, error: BaseException | None, cancelled: bool) -> None:
        """Complete ``job.future`` with one outcome, after the messages queued before."""
        self._items.put(("finish", (job, value, error, cancelled)))

    def close(self) -> None:
        """End the thread once everything queued before has run."""
        self._items.put(("close", None))

    def _run(self) -> None:
        while True:
            kind, item = self._items.get()
            if kind == "close":
                return
            if kind == "callback":
                self._callbacks.append(item)
                backlog, self._backlog = self._backlog, []
                for message in backlog:
                    _call(item, message)
            elif kind == "message":
                self._dispatch(item)
            else:
                self._complete(*item)

    def _dispatch(self, item: tuple[int, dict]) -> None:
        if not self._callbacks:
            self._backlog.append(item)
        for callback in list(self._callbacks):
            _call(callback, item)


    def _complete(self, job, value: Any, error: BaseException | None, cancelled: bool) -> None:
        """Send the last message of a failed or cancelled job, then complete its future (once)."""
        if job.index in self._completed:
            return
        self._completed.add(job.index)
        future = job.future
        if cancelled:
            self._dispatch((job.index, {"state": "cancelled"}))
            future.cancel()  # a no-op when the caller's cancel() got there first
        elif error is not None:
            self._dispatch((job.index, {"state": "failed", "error": str(error).split("\n")[0]}))
            future.set_exception(error)
        else:
            future.set_result(value)


class OnlyStates:
    """An ``after_each`` callback that sees only messages of some states (``ValueError`` for a
    state not in ``MESSAGE_STATES``)."""

    def __init__(self, callback: Callable[[int, dict], Any], states: str | Iterable[str]):
        self.states = frozenset([states] if isinstance(states, str) else states)
        if unknown := sorted(self.states - set(MESSAGE_STATES)):
            raise ValueError(f"after_each(states=...): {unknown} are not message states; "
                             f"use some of {', '.join(MESSAGE_STATES)}")
        self.callback = callback

    def __call__(self, job_index: int, message: dict) -> None:
        if message.get("state") in self.states:
            self.callback(job_index, message)

    def __repr__(self) -> str:
        return f"{self.callback!r} (states {sorted(self.states)})"


def _call(callback: Callable, item: tuple[int, dict]) -> None:
    """``callback(job_index, message)``; a failure is logged, never raised into the sweep."""
    try:
        callback(*item)
    except Exception:  # noqa: BLE001 (a broken callback must not stop the sweep)
        _log.exception("after_each callback %r failed on a message of job %d",
                       callback, item[0])


class Relay:
    """An ``after_each`` callback that passes each message on to listeners attached later, the
    earlier messages first: jobs can be submitted before a slow listener (a figure) exists.

    ``relay.after_each(listener)`` attaches one (as ``DevicePool.after_each``); ``seal()``
    stops keeping messages for listeners yet to come.
    """

    def __init__(self):
        self._lock = threading.Lock()  # one message at a time, in order, to every listener
        self._kept: list[tuple[int, dict]] | None = []
        self._listeners: list[Callable] = []

    def __call__(self, job_index: int, message: dict) -> None:
        with self._lock:
            if self._kept is not None:
                self._kept.append((job_index, message))
            for listener in self._listeners:
                _call(listener, (job_index, message))

    def after_each(self, listener: Callable) -> Callable:
        """Attach ``listener(job_index, message)``; it first gets every message kept so far."""
        with self._lock:
            if self._kept is None:
                raise RuntimeError("Relay.after_each: sealed, earlier messages are gone")
            for item in self._kept:
                _call(listener, item)
            self._listeners.append(listener)
        return listener

    def seal(self) -> None:
        """Keep no more messages: every listener is attached."""
        with self._lock:
            self._kept = None
