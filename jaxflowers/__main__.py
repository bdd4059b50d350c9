"""``python -m jaxflowers {train, sweep, download}``: see ``jaxflowers.cli``."""
import sys

from jaxflowers.cli import main

if __name__ == "__main__":
    sys.exit(main())
