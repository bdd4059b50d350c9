"""``python -m jaxflowers.bench``."""
import sys

from jaxflowers.bench.scaling import main

if __name__ == "__main__":
    sys.exit(main())
