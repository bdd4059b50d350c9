"""Where a ``DevicePool``'s jobs run: local subprocesses or Ray tasks (``base.Backend``)."""

__all__ = ["make_backend"]


def make_backend(name: str, *, log_dir, address, memory_fraction):
    """The backend called ``name`` ("local" or "ray"), imported only when chosen."""
    if name == "local":
        if address is not None:
            raise ValueError("address= is for backend='ray'; the local backend has none")
        from jaxflowers.sweep.backends.local import LocalBackend

        return LocalBackend(log_dir=log_dir, memory_fraction=memory_fraction)
    if name == "ray":
        from jaxflowers.sweep.backends.ray_cluster import RayBackend

        return RayBackend(log_dir=log_dir, address=address, memory_fraction=memory_fraction)
    raise ValueError(f"backend={name!r}: use 'local' or 'ray'")
