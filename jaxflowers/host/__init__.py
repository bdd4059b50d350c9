"""What jaxflowers needs of the host, without JAX: files written atomically, helper
processes, the visible GPUs, signals, durations."""
