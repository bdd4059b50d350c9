"""Labels from scores and their scoring: one confusion counter for charts and users alike,
and no silent class 0 for scores that are not finite."""
import numpy as np
import pytest

import jaxflowers as jf

NAMES = ("cat", "dog", "fox")


def test_non_finite_scores_are_refused_instead_of_becoming_class_0():
    scores = np.array([[0.1, 0.7, 0.2], [np.nan, np.nan, np.nan], [0.5, np.inf, 0.1]])
    with pytest.raises(ValueError,
                       match=r"scores of 2 of 3 images are not finite \(first: row 1\)"):
        jf.scores_to_labels(scores, NAMES)
    assert list(jf.scores_to_labels(scores[:1], NAMES)) == ["dog"]


def test_confusion_matrix_counts_names_or_codes_and_names_bad_labels():
    true, predicted = ["cat", "dog", "dog", "fox"], [0, 1, 2, 2]
    expected = [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    assert jf.confusion_matrix(true, predicted, NAMES).tolist() == expected
    counts = jf.plots.confusion_chart(true, predicted, list(NAMES)).matrix
    assert np.asarray(counts).tolist() == expected  # the chart counts the same way
    with pytest.raises(ValueError, match="confusion_matrix: predicted labels contains 3, which "
                                         "is not one of the 3 classes"):
        jf.confusion_matrix(true, [0, 1, 2, 3], NAMES)
    with pytest.raises(ValueError, match=r"true labels \['wolf'\] are not among"):
        jf.confusion_matrix(["wolf"], [0], NAMES)
    with pytest.raises(ValueError, match="4 true labels but 3 predictions"):
        jf.confusion_matrix(true, [0, 1, 2], NAMES)
