"""A trained network as one file on disk (``TrainedNet.save``, ``jaxflowers.load``)."""

__all__: list[str] = []  # a folder of modules; nothing to import from here
