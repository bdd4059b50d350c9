"""Who takes part in a multi-process run: a TCP check-in with process 0 before
``jax.distributed`` starts, then a watch that names a lost process in one line.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time

__all__ = ["JoinError", "Watch", "check_in"]

_EXIT_LOST = 1  # exit status of a process that stops because another was lost


class JoinError(RuntimeError):
    """Processes of a multi-process run did not all join; the message names them."""


def check_in(address: str, count: int, index: int, timeout: float) -> "Watch":
    """Wait until all ``count`` processes have checked in at ``address`` (process 0 listens).

    Returns a :class:`Watch` to ``start()`` once JAX has started; raises ``JoinError`` naming
    the processes that never joined (or process 0 if unreachable) within ``timeout`` s.
    """
    # why: JAX's coordination service aborts in C++, naming no process, when one never joins.
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    if index == 0:
        peers = _gather(int(port), count, deadline, f"{address} within {timeout:g} s")
        return Watch(0, peers)
    conn = _reach(host.strip("[]"), int(port), deadline, address, timeout)
    _send(conn, {"process": index})
    # Process 0 was listening already, so it answers within `timeout` from now at the latest.
    reply = _receive(conn, time.monotonic() + timeout + 2.0)
    if reply.get("go"):
        return Watch(index, {0: conn})
    conn.close()
    raise JoinError(reply.get("error") or f"process 0 at {address} ended the check-in "
                                          f"within {timeout:g} s without an answer")


def _gather(port: int, count: int, deadline: float, where: str) -> dict[int, socket.socket]:
    """Process 0: accept one connection per other process until all came or the deadline."""
    family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
    server = socket.create_server(("", port), family=family, reuse_port=False,
                                  dualstack_ipv6=family == socket.AF_INET6)
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < count - 1 and time.monotonic() < deadline:
            server.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = server.accept()
            except socket.timeout:
                break
            index = _receive(conn, deadline).get("process")
            if not isinstance(index, int) or not 0 < index < count or index in peers:
                peers[-1] = conn  # told below, with the others
                _fail(peers, f"a process at {conn.getpeername()[0]} claimed process id "
                             f"{index!r}, but the ids are 1..{count - 1} besides process 0, "
                             "each used once")
            peers[index] = conn
    finally:
        server.close()  # JAX's coordination service binds this port next
    missing = [i for i in range(1, count) if i not in peers]
    if missing:
        _fail(peers, f"{_processes(missing)} of {count} never joined the coordinator at "
                     f"{where}; start every process with the same command and its own id")
    for conn in peers.values():
        _send(conn, {"go": True})
    return peers


def _fail(peers: dict[int, socket.socket], error: str) -> None:
    for conn in peers.values():
        _send(conn, {"error": error})
        conn.close()
    raise JoinError(error)


def _reach(host: str, port: int, deadline: float, address: str,
           timeout: float) -> socket.socket:
    """Connect to process 0, retrying until the deadline (it may start later)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.01, min(
                5.0, deadline - time.monotonic())))
        except OSError as error:
            if time.monotonic() >= deadline:
                raise JoinError(f"process 0 (the coordinator at {address}) could not be "
                                f"reached within {timeout:g} s: {error.strerror or error}"
                                ) from None
            time.sleep(0.2)


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


def _receive(conn: socket.socket, deadline: float | None) -> dict:
    """One JSON line from ``conn`` ({} at EOF, on an error or after the deadline)."""
    data = b""
    while not data.endswith(b"\n"):
        if deadline is not None:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = conn.recv(4096)
        except OSError:
            return {}
        if not chunk:
            return {}
        data += chunk
    try:
        return json.loads(data)
    except ValueError:
        return {}


def _processes(indices) -> str:
    indices = list(indices)
    return ("process " if len(indices) == 1 else "processes ") + ", ".join(map(str, indices))


class Watch:
    """Stops this process, naming the peer, when a check-in connection ends without goodbye."""

    def __init__(self, index: int, peers: dict[int, socket.socket]):
        self.index, self.peers = index, peers
        self._failed = False

    def start(self) -> None:
        """Watch in daemon threads; say goodbye (or that this process failed) at exit."""
        # A peer that dies (even by SIGKILL) closes its end at once; keepalive finds lost hosts.
        for peer, conn in self.peers.items():
            _keepalive(conn)
            conn.settimeout(None)
            threading.Thread(target=self._watch, args=(peer, conn), daemon=True,
                             name=f"roster-watch-{peer}").start()
        previous = sys.excepthook

        def excepthook(*exc_info):
            self._failed = True  # an uncaught exception: the others should stop too
            previous(*exc_info)

        sys.excepthook = excepthook
        atexit.register(self.close)

    def close(self) -> None:
        """Tell every peer this process ends (normally or not), then close."""
        for conn in self.peers.values():
            _send(conn, {"failed" if self._failed else "bye": self.index})
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _watch(self, peer: int, conn: socket.socket) -> None:
        while True:
            message = _receive(conn, None)
            if "bye" in message:
                return
            if "lost" in message:  # process 0 passes on who it lost
                _stop(message["lost"])
            if "failed" in message:
                self._tell_others(peer)
                _stop(f"process {message['failed']} stopped with an error (see its output); "
                      "stopping this process too")
            if not message:  # EOF or a reset without goodbye: the peer is gone
                self._tell_others(peer)
                _stop(f"process {peer} was lost (it ended without finishing; killed, out "
                      f"of memory or its host down?); stopping process {self.index} too")

    def _tell_others(self, peer: int) -> None:
        if self.index == 0:
            for other, conn in self.peers.items():
                if other != peer:
                    _send(conn, {"lost": f"process {peer} was lost; process 0 stops every "
                                         "process"})


def _keepalive(conn: socket.socket, idle: int = 10) -> None:
    """Probe an idle connection so a host that vanished without closing it is noticed."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _stop(line: str) -> None:
    """Print ``error: line`` as the last line, on a line of its own, and end this process at
    once (its collectives can never finish)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # The main thread may be halfway through the traceback of a collective the lost process
    # broke: the line starts after a newline, and what other threads write from here on is
    # dropped, so it stays the last.
    err = os.dup(2)
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    os.write(err, f"\nerror: {line}\n".encode())
    os._exit(_EXIT_LOST)
