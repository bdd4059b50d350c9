"""Training: ``train`` (MATLAB's ``trainnet``) and what it is made of.

``run`` puts the pieces together; ``program`` compiles what runs on the devices (``step``
is the pure per-device step, ``layout`` its parameter layout); ``loop`` drives it and
``stop`` says why it ended; ``checkpoint``, ``population``, ``early_stopping``,
``progress``, ``history``, ``table`` and ``tensorboard`` keep and report what it did.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "run": ["train"], "info": ["TrainingInfo"], "stop": ["StopReason"]})
