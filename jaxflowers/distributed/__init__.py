"""Several processes (hosts) in one training: ``initialize`` joins them (``jax.distributed``)."""
from jaxflowers.distributed.join import (
                                               COORDINATOR_ENV,
                                               NUM_PROCESSES_ENV,
                                               PROCESS_ID_ENV,
                                               DistributedError,
                                               initialize,
                                               resolve,
)

__all__ = ["COORDINATOR_ENV", "DistributedError", "NUM_PROCESSES_ENV", "PROCESS_ID_ENV",
           "initialize", "resolve"]
