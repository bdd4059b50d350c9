"""Training: ``train`` (MATLAB's ``trainnet``) and what it is made of.

``run`` puts the pieces together; ``program`` compiles what runs on the devices (``step``
is the pure per-device step); ``loop`` drives it; ``checkpoint``, ``population``,
``objective``/``output_network`` (early stopping, the returned network), ``progress``,
``history``, ``table`` and ``tensorboard`` record and report.
"""
from jaxflowers.host.lazy import lazy_names

_EXPORTS = {"train": "jaxflowers.training.run", "TrainingInfo": "jaxflowers.training.info",
            "StopReason": "jaxflowers.training.stop"}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_names(__name__, globals(), _EXPORTS)
