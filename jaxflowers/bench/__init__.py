"""The scaling benchmark of ``jaxflowers.train``: ``python -m jaxflowers.bench``."""
from jaxflowers.bench.scaling import (
                                  BenchModel,
                                  BenchSettings,
                                  config_options,
                                  device_counts,
                                  main,
                                  measure,
                                  parse_model,
                                  run,
                                  synthetic_set,
)

__all__ = ["BenchModel", "BenchSettings", "config_options", "device_counts", "main", "measure",
           "parse_model", "run", "synthetic_set"]
