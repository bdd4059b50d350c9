"""Command line: ``python -m jaxflowers {train, download, sweep, export}``.

``python -m jaxflowers train`` with no arguments trains ``cifar_net(depth=2)`` on the
embedded handwritten digits (offline), 90/10 stratified split, on every local device, and
prints the test accuracy. A failure prints one line ``error: ...`` and exits 1 (the whole
traceback with ``--debug`` or ``JAXFLOWERS_DEBUG=1``); Ctrl-C (SIGINT) and SIGTERM print one
line, keep what can be kept, and exit 130 and 143.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from jaxflowers.cli import export as export_cli  # imports no JAX
from jaxflowers.cli import sweep as sweep_cli  # imports no JAX
from jaxflowers.cli import train as train_cli
from jaxflowers.cli.train import Interrupted, stage
from jaxflowers.host import signals

__all__ = ["DEBUG_ENV", "main"]

DEBUG_ENV = "JAXFLOWERS_DEBUG"  # "1": failures print their whole traceback
# Errors whose message reads well alone; any other type is named before its message.
_PLAIN_ERRORS = (ValueError, TypeError, OSError, RuntimeError, ImportError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jaxflowers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help=f"on failure print the whole traceback, not one line (default: "
                             f"off; ${DEBUG_ENV}=1 does the same)")
    commands = parser.add_subparsers(dest="command", required=True)
    train_cli.add_parser(commands, common)
    sweep_cli.add_parser(commands, parents=[common])
    export_cli.add_parser(commands, common)
    download = commands.add_parser("download", parents=[common], help="download a data set")
    download.add_argument("name", choices=("flowers",),
                          help="the data set: flowers (the 218 MB Flowers archive, sha256-checked)")
    download.add_argument("dest", help="folder to download and extract into (created if missing)")
    return parser


def _download(args) -> int:
    from jaxflowers.data import download_flowers

    with stage("downloading", ("the partial download, which the next call resumes",)):
        print(download_flowers(args.dest))
    return 0


def main(argv=None) -> int:
    """Run the command line; the exit status (0; 1 failed; 2 bad arguments; 130, 143 signals)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "resume", False) and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir DIR, the folder of the run to continue")
    debug = getattr(args, "debug", False) or os.environ.get(DEBUG_ENV) == "1"
    command = {"train": train_cli.run, "sweep": sweep_cli.run, "download": _download,
               "export": export_cli.run}[args.command]
    with warnings.catch_warnings(), signals.sigterm_raises():  # both restored afterwards
        if not debug:
            warnings.showwarning = _show_warning
        return _run(command, args, debug)


def _run(command, args, debug: bool) -> int:
    """``command(args)``, its failures as one line (or the traceback when debugging)."""
    try:
        return command(args)
    except Interrupted as stop:
        print(stop, file=sys.stderr)
        return stop.status
    except KeyboardInterrupt as stop:
        print(f"{signals.signal_words(stop)} ({args.command})", file=sys.stderr)
        return signals.exit_status(stop)
    except Exception as error:  # noqa: BLE001 (every failure becomes one line)
        if debug:
            raise
        print(_one_line(error), file=sys.stderr)
        return 1


def _one_line(error: BaseException) -> str:
    """``error: <first line of the message>``, with the type where the message needs it."""
    lines = str(error).strip().splitlines() or [""]
    text = lines[0]
    if not isinstance(error, _PLAIN_ERRORS) or not text:
        text = f"{type(error).__name__}: {text}".rstrip(": ")
    more = f" (--debug or {DEBUG_ENV}=1 shows the rest)" if len(lines) > 1 else ""
    return f"error: {text}{more}"


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line, ``warning: ...``, without the source line."""
    print(f"warning: {message}", file=file or sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
