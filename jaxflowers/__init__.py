"""jaxflowers: train image classifiers on every local GPU with JAX, Flax and Optax."""
from jaxflowers import data, models

__all__ = ["data", "models"]
__version__ = "0.1.0"
