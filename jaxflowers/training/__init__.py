"""Training: ``train`` (MATLAB's ``trainnet``) and what it is made of.

``run`` puts the pieces together, ``program`` compiles ``step`` for the devices, ``loop``
drives it; the other modules keep and report what it did.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "run": ["train"], "info": ["TrainingInfo"], "stop": ["StopReason"]})
