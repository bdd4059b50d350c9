"""The progress bar beside the verbose table: iterations, iterations/s and the time left, with
the last loss and accuracy; on a terminal or in Jupyter only (``host.terminal``)."""
from __future__ import annotations

from jaxflowers.host.terminal import progress_bar
from jaxflowers.training.history import History

__all__ = ["TrainingBar"]


class TrainingBar:
    """A tqdm bar over the run's ``total`` iterations, fed from ``history`` at each sync point.

    Args:
      history: the run's record (a resumed run starts the bar at its iterations).
      total: iterations of the whole plan. stream: where it draws (default stderr).
    """

    def __init__(self, history: History, total: int, stream=None):
        self.history = history
        # leave=False: gone at the end, the table stays as the record; mininterval=0: it is
        # fed at sync points only, each worth showing
        self._bar = progress_bar(total, desc="Training", unit="it",
                                 initial=history.iterations_done, file=stream, leave=False,
                                 mininterval=0)

    @property
    def shown(self) -> bool:
        """Whether the bar draws (a terminal or Jupyter) rather than keeping quiet."""
        return not self._bar.disable

    def update(self) -> None:
        """Move to the iterations recorded, showing the last mini-batch loss and accuracy."""
        done = self.history.iterations_done
        if done > self._bar.n:
            row = self.history.row(done)
            self._bar.set_postfix_str(f"loss {row['loss']:.4f}, accuracy {row['accuracy']:.1f}%",
                                      refresh=False)
            self._bar.update(done - self._bar.n)

    def writing(self):
        """A context for printing lines above the bar (the table) without breaking it."""
        return self._bar.external_write_mode()

    def close(self) -> None:
        self.update()
        self._bar.close()
