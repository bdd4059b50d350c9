"""Moved to ``jaxflowers.training.population``; this path is kept for one release."""
import warnings

from jaxflowers.training.population import population_statistics

__all__ = ["population_statistics"]

warnings.warn("jaxflowers.population is now jaxflowers.training.population",
              DeprecationWarning, stacklevel=2)
