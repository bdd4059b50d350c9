"""What jaxflowers needs of the host, without JAX: atomic files, processes, GPUs, signals."""

__all__: list[str] = []  # a folder of modules; nothing to import from here
