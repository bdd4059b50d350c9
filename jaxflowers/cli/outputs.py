"""Where a command-line run keeps what it writes: one run folder per run, by default a new one
under ``./runs/`` named by date and time (as Lightning's ``lightning_logs/version_N``), so
nothing lands in the working folder unasked."""
from __future__ import annotations

import datetime
import os
import pathlib

from jaxflowers.host.files import unwritable

__all__ = ["RUNS", "RunOutputs", "new_run_folder"]

RUNS = "runs"  # the folder of run folders, in the working folder


def new_run_folder(root: str | os.PathLike = RUNS, *, suffix: str = "") -> pathlib.Path:
    """Create and return ``root/<YYYY-MM-DD_HH-MM-SS><suffix>`` (``-2``, ``-3``, ... added when
    a run of the same second has it); OSError where it cannot be made."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S") + suffix
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{root} already holds 999 run folders named {stamp}")


class RunOutputs:
    """The run folder (``--out``, or a new one under ``runs/``) and the ``--save`` file in it.

    ``--save NAME`` without a folder goes into the run folder; a path with a folder (``./net.zip``,
    ``nets/net.zip``, ``/abs/net.zip``) is used as given.
    """

    def __init__(self, out: str | None, save: str | None, *, suffix: str = ""):
        self.given = out is not None
        self.folder = pathlib.Path(out) if out is not None else None  # set by create()
        self.suffix = suffix
        self._save = save
        self._made: list[pathlib.Path] = []  # folders create() made, innermost first

    def check(self, **folders) -> None:
        """OSError naming the flag unless the run folder (or ``runs/``), the ``--save`` folder
        and ``folders`` ({flag: folder}) can take files; given folders are created."""
        if self._save and os.path.isdir(self._save):
            raise IsADirectoryError(f"--save {self._save} is a folder; give a file name, such "
                                    f"as {os.path.join(self._save, 'net.zip')}")
        if not self.given and not os.path.isdir(RUNS):
            self._made.append(pathlib.Path(RUNS))  # made by the check below
        wanted = {"--out": self.folder if self.given else RUNS, **folders}
        if self._save and os.path.dirname(self._save):
            wanted["--save"] = os.path.dirname(os.path.abspath(self._save))
        for flag, folder in wanted.items():
            problem = folder and unwritable(folder)
            if problem:
                raise OSError(f"{flag}: cannot write into {os.path.abspath(folder)} ({problem})")

    def create(self) -> pathlib.Path:
        """Make the run folder (a new one unless ``--out`` named it); the folder."""
        if self.folder is None:
            self.folder = new_run_folder(suffix=self.suffix)
            self._made.insert(0, self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder

    def discard_if_empty(self) -> None:
        """Remove the folders ``create`` made if nothing was written (a run that failed
        before any output leaves no trace)."""
        for folder in self._made:
            try:
                folder.rmdir()  # only if empty
            except OSError:
                return

    def path(self, name: str) -> pathlib.Path:
        """``name`` in the run folder (``create`` first)."""
        if self.folder is None:
            raise RuntimeError("RunOutputs.path before create()")
        return self.folder / name

    @property
    def save(self) -> pathlib.Path | None:
        """Where ``--save`` writes the network, or None."""
        if not self._save:
            return None
        return pathlib.Path(self._save) if os.path.dirname(self._save) else self.path(self._save)
