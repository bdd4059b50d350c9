"""Validation metrics (MATLAB's Metrics, ObjectiveMetricName) through ``train``: the recorded
figures equal scikit-learn's on the predictions of the returned network, over a validation
set that does not divide into the devices' batches; the table shows them; a schedule's
rates are recorded per iteration."""
import contextlib
import io

import numpy as np
import pytest
from sklearn import metrics as skm
from test_train import table_rows

import jaxflowers as jf
from jaxflowers.inference.metrics import score


@pytest.fixture(scope="module")
def run(digits):
    rng = np.random.default_rng(1)
    per_class = [rng.permutation(np.flatnonzero(digits.labels == c)) for c in range(10)]
    val_index = np.concatenate([p[:4] for p in per_class])[:37]  # every class, 37 images
    train_index = np.concatenate([p[4:14] for p in per_class])  # 100 images
    train, val = digits.subset(train_index), digits.subset(val_index)
    schedule = (jf.schedules.Warmup(num_steps=4), "cosine")
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=16,
                              max_epochs=3, shuffle="every-epoch", validation_data=val,
                              validation_frequency=3, verbose_frequency=100,
                              metrics=("accuracy", "fscore", "precision", "recall", "auc"),
                              objective_metric_name="fscore", output_network="best-validation",
                              batch_normalization_statistics="moving",
                              learn_rate_schedule=schedule)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        net, info = jf.train(train, jf.models.cifar_net(1), opts)
    return net, info, val, out.getvalue()


def test_recorded_metrics_equal_scikit_learn_on_the_returned_network(run):
    net, info, val, _ = run
    scores = jf.predict(net, val)
    predicted = np.argmax(scores, 1)
    expected = {
        "fscore": skm.f1_score(val.labels, predicted, average="macro", zero_division=0),
        "precision": skm.precision_score(val.labels, predicted, average="macro", zero_division=0),
        "recall": skm.recall_score(val.labels, predicted, average="macro", zero_division=0),
        "auc": skm.roc_auc_score(val.labels, scores, multi_class="ovr", average="macro"),
    }
    # objective_metric_name="fscore": the returned network is the best F-score's.
    best = int(np.argmax(info.validation_metrics["fscore"]))
    assert info.output_network_iteration == info.validation_iteration[best]
    assert set(info.validation_metrics) == set(expected)
    for name, value in expected.items():
        assert info.validation_metrics[name].shape == info.validation_iteration.shape
        assert info.validation_metrics[name][best] == pytest.approx(value, abs=1e-6), name
        assert info.final_validation_metrics[name] == pytest.approx(value, abs=1e-6), name
    accuracy = 100 * skm.accuracy_score(val.labels, predicted)
    assert info.validation_accuracy[best] == pytest.approx(accuracy)
    assert info.final_validation_accuracy == pytest.approx(accuracy)


def test_the_table_shows_each_metric_at_each_validation(run):
    _, info, _, out = run
    rows = {int(row["Iteration"]): row for row in table_rows(out)}
    assert list(rows[1])[7:] == ["F-score", "Precision", "Recall", "AUC", "Learning rate"]
    for i, iteration in enumerate(info.validation_iteration):
        cells = rows[int(iteration)]
        assert cells["F-score"] == f"{info.validation_metrics['fscore'][i]:.4f}"
        assert cells["AUC"] == f"{info.validation_metrics['auc'][i]:.4f}"


def test_the_schedule_s_rates_are_recorded_per_iteration(run):
    """("warmup", "cosine") with MATLAB's defaults otherwise: 4 iterations from 0 to the
    base rate, then a cosine over the remaining epochs (6 iterations each) by epoch."""
    _, info, _, _ = run
    k = np.arange(18)
    warm = 0.05 * k[:4] / 4
    epochs = (k[4:] - 4) // 6  # completed epochs of the cosine, 3 epochs for 14 iterations
    cosine = 0.05 * 0.5 * (1 + np.cos(np.pi * epochs / 3))
    np.testing.assert_allclose(info.learn_rate, np.concatenate([warm, cosine]), rtol=1e-6,
                               atol=1e-9)


def test_score_handles_absent_classes_like_scikit_learn():
    """A class never predicted nor present counts as absent (scikit-learn's labels=None);
    AUC averages over the classes present among the labels."""
    logits = np.log(np.array([[0.7, 0.2, 0.1, 0.0001], [0.1, 0.8, 0.1, 0.0001],
                              [0.6, 0.3, 0.1, 0.0001], [0.2, 0.2, 0.6, 0.0001]]))
    labels = np.array([0, 1, 1, 2])
    got = score(logits, labels, ("fscore", "auc"))
    assert got["fscore"] == pytest.approx(skm.f1_score(labels, [0, 1, 0, 2], average="macro"))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    auc = np.mean([skm.roc_auc_score(labels == c, probs[:, c]) for c in (0, 1, 2)])
    assert got["auc"] == pytest.approx(auc)
    assert got["accuracy"] == pytest.approx(75.0)
