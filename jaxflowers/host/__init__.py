"""What jaxflowers needs of the host, without JAX: atomic files, processes, GPUs, signals."""
