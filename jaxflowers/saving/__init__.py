"""A trained network as one file on disk (``TrainedNet.save``, ``jaxflowers.load``)."""
