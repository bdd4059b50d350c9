"""The command line: ``python -m jaxflowers {train, sweep, download}``."""
from jaxflowers.cli.entry import main

__all__ = ["main"]
