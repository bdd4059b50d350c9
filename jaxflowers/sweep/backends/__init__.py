"""Where a ``DevicePool``'s jobs run: local subprocesses or Ray tasks (``base.Backend``)."""

__all__: list[str] = []  # a folder of modules; nothing to import from here
