"""``python -m jaxflowers {train, sweep, download, export}``: see ``jaxflowers.cli``."""
from jaxflowers.cli import main
from jaxflowers.host.processes import exit_without_teardown

if __name__ == "__main__":
    exit_without_teardown(main())
