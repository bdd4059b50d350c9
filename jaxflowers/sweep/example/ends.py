"""The parfeval example's work on each job as it ends, while the others still train: its
outcome, its metrics CSV, and the best network so far tested and its confusion chart drawn
into memory. The sweep's end then waits only for what the last job changed."""
from __future__ import annotations

import concurrent.futures
import io
import pathlib
import threading
from typing import Any, Mapping, Sequence

from jaxflowers import recipes
from jaxflowers.host.files import write_atomic
from jaxflowers.sweep.example import report as results
from jaxflowers.sweep.example.report import JobOutcome

__all__ = ["BestTest", "JobEnds", "job_outcome"]


def job_outcome(position: int, future, depth: int) -> tuple[Any, JobOutcome]:
    """A finished job's output (None if it failed) and how it ended; a diverged run has failed."""
    error = "cancelled" if future.cancelled() else future.exception()
    output = None if error else future.result()  # may import JAX: no backend is started
    info = None if output is None else output[1]
    if info is not None and info.diverged:
        error = info.stop_reason
    return output, JobOutcome(position, depth, info, str(error).split("\n")[0] if error else None)


class BestTest:
    """The best network's test: ``facts`` for the summary, and ``save(path)`` for its
    confusion chart (drawn once; ``drawn`` says whether it already is, in memory)."""

    def __init__(self, position: int, depth: int, test_set, codes, class_names):
        from jaxflowers.inference.labels import Labels, accuracy

        self.position, self.depth = position, depth
        predicted = Labels(codes, class_names)
        self._labels, self._codes, self._class_names = test_set.labels, predicted.codes, class_names
        self.accuracy, self.images = 100.0 * accuracy(predicted, test_set.labels), len(test_set)
        self._png: bytes | None = None

    @property
    def facts(self) -> dict:
        """What ``sweep_results.json`` keeps of the test."""
        return {"test_accuracy": self.accuracy, "test_images": self.images}

    @property
    def drawn(self) -> bool:
        return self._png is not None

    def draw(self) -> None:
        """Draw the confusion chart into memory as a PNG (as ``save`` writes it)."""
        import matplotlib.pyplot as plt

        from jaxflowers.plots import confusion_chart

        chart = confusion_chart(  # sized to the class count
            self._labels, self._codes, self._class_names, row_summary="row-normalized",
            column_summary="column-normalized",
            title=f"cifar_net depth {self.depth}: test accuracy {self.accuracy:.2f}%")
        try:
            buffer = io.BytesIO()
            chart.savefig(buffer, format="png", dpi=100)
            self._png = buffer.getvalue()
        finally:
            plt.close(chart.figure)  # nothing left open

    def save(self, path: pathlib.Path) -> None:
        """Write the confusion chart to ``path`` (PNG), drawing it first if it is not yet."""
        if self._png is None:
            self.draw()
        write_atomic(path, lambda file: file.write(self._png))


class JobEnds:
    """Follows a sweep's futures in a thread of its own; as each job ends it takes the job's
    outcome, writes its ``metrics-job<i>.csv`` into ``out``, and, when the job is the best so
    far (the highest validation accuracy, the first job among equals), tests it on the plan's
    test set and (with ``charts``) draws its confusion chart.

    Args:
      futures: the jobs' futures, in job order. depths: each job's cifar_net depth.
      plan: the example's plan (its test set). out: the run folder.
      charts: draw the best network's chart ahead; None: unless a figure window is open
        (pyplot's windows belong to the main thread).
    """

    def __init__(self, futures: Sequence, depths: Sequence[int], plan: Mapping,
                 out: pathlib.Path, *, charts: bool | None = None):
        if charts is None:
            from jaxflowers.plots.backend import has_window

            charts = not has_window()
        self._futures, self._depths, self._plan, self._out = list(futures), depths, plan, out
        self._charts = charts
        self._ends: dict[int, tuple[Any, JobOutcome]] = {}
        self.metrics: dict[int, str] = {}  # job position -> its CSV's name in ``out``
        self._written: set[int] = set()  # jobs whose CSV was tried (a failure warns once)
        self._best: BestTest | None = None
        self._test_set = None
        self._thread = threading.Thread(target=self._follow, name="jaxflowers-job-ends",
                                        daemon=True)
        self._thread.start()

    @property
    def best_so_far(self) -> BestTest | None:
        """The test of the best job that has ended so far (None before any has a score)."""
        return self._best

    def results(self) -> tuple[list, list[JobOutcome]]:
        """Wait for every job and this thread; each job's output and outcome, in job order."""
        concurrent.futures.wait(self._futures)
        self._thread.join()
        ends = [self._ends.get(k) or job_outcome(k, future, depth)  # if the thread failed
                for k, (future, depth) in enumerate(zip(self._futures, self._depths))]
        missing = [outcome for k, (_, outcome) in enumerate(ends) if k not in self._written]
        self.metrics.update(results.write_metrics(missing, self._out))
        return [output for output, _ in ends], [outcome for _, outcome in ends]

    def test(self, position: int, outputs: Sequence) -> BestTest:
        """The test of job ``position`` (the best): the one made as it ended, else made now."""
        if self._best is not None and self._best.position == position:
            return self._best
        net, _, codes = outputs[position]
        return BestTest(position, self._depths[position], self._load_test_set(), codes,
                        net.class_names)

    def _follow(self) -> None:
        positions = {future: k for k, future in enumerate(self._futures)}
        for future in concurrent.futures.as_completed(self._futures):
            try:
                self._ended(positions[future], future)
            except Exception:  # noqa: BLE001 (the end of the sweep does it again, and says why)
                continue

    def _ended(self, position: int, future) -> None:
        output, outcome = job_outcome(position, future, self._depths[position])
        self._ends[position] = (output, outcome)
        self.metrics.update(results.write_metrics([outcome], self._out))
        self._written.add(position)
        if outcome.accuracy is None or output[2] is None:
            return
        best = self._best
        if best is not None:
            held = self._ends[best.position][1].accuracy
            if (held, -best.position) >= (outcome.accuracy, -position):
                return
        net, _, codes = output
        test = BestTest(position, outcome.depth, self._load_test_set(), codes, net.class_names)
        self._best = test
        if self._charts:
            test.draw()

    def _load_test_set(self):
        if self._test_set is None:
            self._test_set = recipes.load_plan(self._plan)[2]
        return self._test_set
