"""The training loop through the public API: epochs, validation, the table, output_fn, errors."""
import contextlib
import importlib
import io
import re
import threading
import time

import numpy as np
import pytest

import jaxflowers as jf


@pytest.fixture(scope="module")
def small(digits):
    rng = np.random.default_rng(0)
    keep = rng.permutation(len(digits))[:130]
    return digits.subset(keep[:100]), digits.subset(keep[100:])


@pytest.fixture(scope="module")
def run(small):
    train, val = small
    messages = []
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=16,
                              max_epochs=2, validation_data=val, validation_frequency=5,
                              verbose_frequency=4, shuffle="every-epoch",
                              output_fn=messages.append)
    out, err = io.StringIO(), io.StringIO()  # a log file, not a terminal
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        net, info = jf.train(train, jf.models.cifar_net(1), opts)
    assert "\r" not in err.getvalue()  # no progress bar's carriage returns in a log
    return net, info, messages, out.getvalue()


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a shell's stdout and stderr do."""

    def isatty(self):
        return True


def test_on_a_terminal_a_bar_with_rate_and_eta_runs_under_the_table(small):
    train, val = small
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=16,
                              max_epochs=2, validation_data=val, validation_frequency=5,
                              verbose_frequency=4, shuffle="every-epoch")
    out, err = Terminal(), Terminal()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        jf.train(train, jf.models.cifar_net(1), opts)
    frames = err.getvalue().split("\r")
    assert any(re.search(r"Training: +\d+%.*\| 12/12 \[\d\d:\d\d<\d\d:\d\d, .*it/s, loss "
                         r"[\d.]+, accuracy [\d.]+%\]", frame) for frame in frames), frames
    assert [int(row["Iteration"]) for row in table_rows(out.getvalue())] == [1, 4, 5, 8, 10, 12]


def test_epochs_drop_the_last_partial_batch(run):
    _, info, _, _ = run
    # 100 images, batch 16: 6 whole batches per epoch (4 images dropped), 2 epochs.
    np.testing.assert_array_equal(info.iteration, np.arange(1, 13))
    np.testing.assert_array_equal(info.epoch, [1] * 6 + [2] * 6)
    assert info.loss.shape == info.accuracy.shape == info.learn_rate.shape == (12,)
    assert np.all(np.isfinite(info.loss)) and np.all((0 <= info.accuracy) & (info.accuracy <= 100))
    np.testing.assert_allclose(info.learn_rate, 0.05)


def test_validation_every_frequency_and_at_the_end(run):
    net, info, _, _ = run
    np.testing.assert_array_equal(info.validation_iteration, [5, 10, 12])
    # With validation data "auto" returns the best-validation network (by loss), and its
    # final scores are those of the returned network, population statistics and all
    # (test_final_validation_matches_predict).
    best = int(np.argmin(info.validation_loss))
    assert info.output_network_iteration == info.validation_iteration[best]
    assert np.isfinite(info.final_validation_loss) and 0 <= info.final_validation_accuracy <= 100
    assert info.compile_time > 0 and info.train_time > 0 and info.images_per_second > 0
    assert 0 < info.placing_time <= info.setup_time and info.compile_time <= info.setup_time
    assert info.num_devices == 4 and not info.stopped_early
    assert info.stop_reason == "max epochs completed" and not info.diverged
    assert net.class_names == tuple(str(d) for d in range(10))
    assert net.input_shape == (32, 32, 3)


def test_final_validation_matches_predict(run, small):
    net, info, _, _ = run
    _, val = small
    labels = jf.scores_to_labels(jf.predict(net, val), net.class_names)
    assert 100 * jf.accuracy(labels, val.labels) == pytest.approx(info.final_validation_accuracy)


def table_rows(text: str) -> list[dict]:
    """The verbose table's rows in ``text`` as {column title: cell}, the columns read off the
    rule under the two header lines (cells are right-aligned over its dashes)."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.strip() and set(line) <= {" ", "-"})
    spans = [m.span() for m in re.finditer(r"-+", lines[rule])]
    titles = [f"{lines[rule - 2][a:b].strip()} {lines[rule - 1][a:b].strip()}".strip()
              for a, b in spans]
    rows = []
    for line in lines[rule + 1:]:
        cells = [line[a:b].strip() for a, b in spans]
        if cells[0].isdigit() and cells[1].isdigit():
            rows.append(dict(zip(titles, cells)))
    return rows


def test_verbose_table_rows(run):
    *_, out = run
    rows = table_rows(out)
    iterations = [int(r["Iteration"]) for r in rows]
    assert iterations == [1, 4, 5, 8, 10, 12]  # first, every 4th, validations, last
    assert "Training on 4 cpu devices" in out and "(4 per device)" in out
    assert list(rows[0]) == ["Epoch", "Iteration", "Elapsed hh:mm:ss", "Training accuracy",
                             "Validation accuracy", "Training loss", "Validation loss",
                             "Learning rate"]
    assert out.rstrip().endswith("Training finished: max epochs completed.")
    assert rows[-1]["Validation accuracy"].endswith("%") and not rows[0]["Validation loss"]
    assert max(len(line) for line in out.splitlines()[1:]) <= 100  # a terminal's width


def test_reading_results_one_sync_point_late_changes_nothing(small, monkeypatch):
    """On GPUs the host reads each sync point's results (metrics, validation) one sync
    point later while the devices run ahead (train._look_ahead; 0 on CPUs, whose
    collectives time out with many programs queued, so forced here on one device). History
    and table must be exactly those of the loop that reads every result at once."""
    train_module = importlib.import_module("jaxflowers.training.run")  # the module, not jf.train

    train, val = small
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=16,
                              max_epochs=2, validation_data=val, validation_frequency=5,
                              verbose_frequency=4, shuffle="every-epoch")
    results = []
    for look_ahead in (0, 1):
        monkeypatch.setattr(train_module, "_look_ahead", lambda *_, ahead=look_ahead: ahead)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            _, info = jf.train(train, jf.models.cifar_net(1), opts,
                               execution=jf.ExecutionOptions(num_devices=1))
        rows = [{k: v for k, v in row.items() if k != "Elapsed hh:mm:ss"}  # all but the clock
                for row in table_rows(out.getvalue())]
        results.append((info, rows))
    (now, rows_now), (late, rows_late) = results
    np.testing.assert_array_equal(late.validation_iteration, [5, 10, 12])
    for field in ("loss", "accuracy", "validation_iteration", "validation_loss",
                  "validation_accuracy"):
        np.testing.assert_array_equal(getattr(late, field), getattr(now, field))
    assert rows_late == rows_now and len(rows_now) == 6


def test_output_fn_sees_every_iteration_in_order(run):
    _, info, messages, _ = run
    iterations = [m["iteration"] for m in messages if m["state"] == "iteration"]
    assert iterations == list(range(1, 13))
    assert messages[0]["state"] == "start" and messages[-1]["state"] == "done"
    val = [m for m in messages if m["state"] == "validation"]
    assert [m["iteration"] for m in val] == [5, 10, 12]
    assert val[-1]["validation_accuracy"] == pytest.approx(info.validation_accuracy[-1])
    assert messages[-1]["final_validation_accuracy"] == info.final_validation_accuracy
    first = next(m for m in messages if m["state"] == "iteration")
    assert first["loss"] == pytest.approx(info.loss[0]) and first["epoch"] == 1


def test_output_fn_returning_true_stops_training(small):
    train, _ = small
    opts = jf.TrainingOptions(mini_batch_size=16, max_epochs=3, verbose=False,
                              output_fn=lambda m: m.get("iteration", 0) >= 3)
    _, info = jf.train(train, jf.models.cifar_net(1), opts)
    # output_fn sees iteration 3 once the block after it is queued: at most one more runs.
    assert info.stopped_early and len(info.loss) in (3, 4, 5)
    assert info.stop_reason == "stopped by output_fn"


@pytest.mark.parametrize("kwargs, message", [
    (dict(mini_batch_size=18), "mini_batch_size=18 is not divisible by 4 devices"),
    (dict(mini_batch_size=128), "mini_batch_size=128 is larger than the 100 training images"),
    (dict(execution_environment="multi-gpu"), 'execution_environment="multi-gpu" needs a GPU'),
    (dict(execution=dict(num_devices=9)), "num_devices=9 is outside 1..4"),
    (dict(execution=dict(parameter_layout="vector")), "parameter_layout='vector'"),
    (dict(execution="fast"), "execution must be ExecutionOptions, a dict of its fields or None"),
])
def test_bad_training_setups_fail_before_compiling(small, kwargs, message):
    train, _ = small
    execution = kwargs.pop("execution", None)
    with pytest.raises((ValueError, RuntimeError, TypeError), match=message):
        jf.train(train, jf.models.cifar_net(1), jf.TrainingOptions(verbose=False, **kwargs),
                 execution=execution)


def test_validation_data_of_another_size_is_refused(small, digits):
    train, _ = small
    other = jf.data.ImageSet(np.zeros((4, 16, 16, 3), np.uint8), np.zeros(4, int),
                             digits.class_names)
    with pytest.raises(ValueError, match=r"validation_data images are \(16, 16, 3\)"):
        jf.train(train, jf.models.cifar_net(1),
                 jf.TrainingOptions(mini_batch_size=16, validation_data=other, verbose=False))


def test_flat_parameter_layout_trains_validates_and_returns_the_same_net(small, run):
    """GPUs keep parameters as one vector ("auto" -> "flat"); on CPU "flat" can be forced.
    Same history and weights as the tree ("auto" on CPU: the `run` fixture), the net comes
    back as the model's tree, and no program is compiled per parameter leaf."""
    import jax

    train, val = small
    net_tree, info_tree, _, _ = run
    compiles = []
    listener = (lambda event, duration, **kw: compiles.append(event)
                if event == "/jax/core/compile/backend_compile_duration" else None)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=16,
                                  max_epochs=2, validation_data=val, validation_frequency=5,
                                  verbose=False, shuffle="every-epoch",
                                  output_fn=lambda message: None)
        net, info = jf.train(train, jf.models.cifar_net(1), opts,
                             execution=jf.ExecutionOptions(parameter_layout="flat"))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    leaves = len(jax.tree.leaves(net.variables["params"]))
    assert jax.tree.structure(net.variables) == jax.tree.structure(net_tree.variables)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 net.variables, net_tree.variables)
    np.testing.assert_allclose(info.loss, info_tree.loss, rtol=1e-4)
    np.testing.assert_allclose(info.validation_accuracy, info_tree.validation_accuracy)
    # init, channel statistics, the block, validation and the unravelling of the vector for
    # it: a handful, not one per leaf.
    assert 0 < len(compiles) < leaves, (len(compiles), leaves)
    np.testing.assert_allclose(jf.predict(net, val), jf.predict(net_tree, val), atol=1e-4)



class _Gated:
    """An image set whose images arrive only when ``gate`` opens, or fail to."""

    def __init__(self, data, gate, error=None):
        self.data, self.gate, self.error = data, gate, error
        self.labels, self.class_names = data.labels, data.class_names
        self.image_shape = data.image_shape

    def __len__(self):
        return len(self.data)

    @property
    def images(self):
        assert self.gate.wait(60)
        if self.error:
            raise self.error
        return self.data.images


def test_the_resident_copy_runs_while_compiling(small):
    """Compiling needs only the set's shape: the initial state and the training block both
    compile while the images are still to come (the set hands them over only then), and
    the copy, once they arrive, trains as usual."""
    import jax

    train, _ = small
    compiled, gate = [], threading.Event()

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)
            if len(compiled) >= 2:  # the init program and the training block
                gate.set()

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        opts = jf.TrainingOptions(mini_batch_size=8, max_epochs=1, verbose=False)
        _, info = jf.train(_Gated(train, gate), jf.models.cifar_net(1), opts)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert len(info.loss) == len(train) // 8 and np.all(np.isfinite(info.loss))


def test_an_unreadable_training_set_fails_train_with_its_error(small):
    train, _ = small
    gate = threading.Event()
    gate.set()
    bad = _Gated(train, gate, OSError("cannot read /data/cache/flowers-224.npy"))
    opts = jf.TrainingOptions(mini_batch_size=8, max_epochs=1, verbose=False)
    with pytest.raises(OSError, match="flowers-224.npy"):
        jf.train(bad, jf.models.cifar_net(1, num_classes=len(train.class_names)), opts,
                 execution=jf.ExecutionOptions(data_placement="resident"))


def test_train_traces_the_model_init_once_with_flat_parameters(small):
    """The one-vector layout is decided from the shapes of the model's init, whose trace the
    init program then reuses: one trace in all."""
    train, _ = small
    inits = []

    class Counting(jf.models.CifarNet):
        def __call__(self, x, train=True):
            if self.is_initializing():
                inits.append(x.shape)
            return super().__call__(x, train=train)

    opts = jf.TrainingOptions(mini_batch_size=16, max_epochs=1, verbose=False)
    net, info = jf.train(train, Counting(depth=1, num_classes=10), opts,
                         execution=jf.ExecutionOptions(parameter_layout="flat"))
    assert len(inits) == 1, inits
    assert len(info.loss) == len(train) // 16


def test_a_validation_that_is_not_finite_stops_the_run_as_divergence(small):
    """Iteration 2 of this run still has a finite training loss (about 1e10), but the
    network's validation logits overflow: that is divergence too, and its accuracy is not
    the 10 % that argmax of NaN scores would make of it."""
    train, val = small
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=1e6, mini_batch_size=16,
                              max_epochs=3, verbose=False, validation_data=val,
                              validation_frequency=2, output_network="last-iteration")
    net, info = jf.train(train, jf.models.cifar_net(1), opts)
    assert info.stopped_by is jf.StopReason.VALIDATION_DIVERGED and info.diverged
    assert info.stop_reason == "validation loss is NaN at iteration 2"
    assert len(info.loss) == 2 and np.all(np.isfinite(info.loss))
    assert np.isnan(info.validation_accuracy[-1]) and np.isnan(info.final_validation_accuracy)
    with pytest.warns(RuntimeWarning, match=r"scores of \d+ of \d+ images are not finite"):
        jf.predict(net, val)


def test_a_diverging_run_stops_at_the_first_non_finite_loss_with_the_last_finite_net(small):
    """MATLAB stops with "Training loss is NaN"; the returned network is the one before."""
    train, _ = small
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=1e6, mini_batch_size=16,
                              max_epochs=3, verbose=False)
    net, info = jf.train(train, jf.models.cifar_net(1), opts)
    k = len(info.loss)
    assert info.diverged and info.stopped_early and k < 18
    assert info.stopped_by is jf.StopReason.DIVERGED
    assert info.stop_reason.endswith(f"at iteration {k}")
    assert info.stop_reason.startswith(("training loss is NaN", "training loss is Inf",
                                        "gradient is not finite"))
    assert np.all(np.isfinite(info.loss[:-1])) or "gradient" in info.stop_reason
    assert all(np.all(np.isfinite(v)) for v in jax_leaves(net.variables))
    # The returned network is exactly the one after iteration k - 1: a run that output_fn
    # stops there (a table row every iteration makes each one a point where it is heard).
    assert k >= 2
    stop_before = opts.replace(output_fn=lambda m: m.get("iteration", 0) >= k - 1,
                               validation_data=None, verbose=True, verbose_frequency=1)
    with contextlib.redirect_stdout(io.StringIO()):
        before, info_before = jf.train(train, jf.models.cifar_net(1), stop_before)
    assert len(info_before.loss) == k - 1 and not info_before.diverged
    for a, b in zip(jax_leaves(net.variables), jax_leaves(before.variables)):
        np.testing.assert_array_equal(a, b)


def test_divergence_inside_a_block_read_late_stops_at_the_same_iteration(small, monkeypatch):
    """Several iterations per dispatch and results read one sync point late (as on GPUs):
    the device skips every step after the bad one, and the history ends there."""
    train_module = importlib.import_module("jaxflowers.training.run")
    train, _ = small
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=1e6, mini_batch_size=16,
                              max_epochs=3, verbose=False)
    _, reference = jf.train(train, jf.models.cifar_net(1), opts,
                            execution=jf.ExecutionOptions(num_devices=1))
    monkeypatch.setattr(train_module, "_look_ahead", lambda *_: 1)
    net, info = jf.train(train, jf.models.cifar_net(1), opts,
                         execution=jf.ExecutionOptions(num_devices=1, steps_per_dispatch=4))
    assert info.stop_reason == reference.stop_reason
    # Same iterations; values within rounding (XLA compiles a step inside a loop its own way).
    np.testing.assert_allclose(info.loss, reference.loss, rtol=1e-2)
    assert all(np.all(np.isfinite(v)) for v in jax_leaves(net.variables))


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def test_setup_time_runs_from_the_call_to_the_first_step(digits, tmp_path):
    """``info.setup_time`` holds all that comes before training: the checks, building and
    compiling the programs, placing the data, and the progress view's first frame."""
    started = {}

    def note(message):
        started.setdefault(message["state"], time.perf_counter())
        return False

    opts = jf.TrainingOptions(mini_batch_size=16, max_epochs=1, verbose=False, output_fn=note,
                              plots="training-progress", plots_path=tmp_path / "progress.png")
    data, model, train = digits.subset(np.arange(64)), jf.models.cifar_net(1), jf.train
    called = time.perf_counter()
    _, info = train(data, model, opts)
    before_training = started["start"] - called
    assert before_training - 0.25 < info.setup_time < before_training + 0.25
    assert started["iteration"] - called < info.setup_time + info.train_time
