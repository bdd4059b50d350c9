"""Where a ``DevicePool``'s jobs run: local subprocesses or Ray tasks (``base.Backend``)."""
