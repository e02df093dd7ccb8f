"""The shared metric helpers: the fast threshold sweep equals the one-call-per-threshold definition."""
import numpy as np
import pytest

from lib.evaluation import best_threshold, mcnemar, metrics_at, per_type_accuracy, threshold_sweep


def test_threshold_sweep_equals_the_definition():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(25):
        n = int(rng.integers(5, 200))
        y, p = rng.integers(0, 2, n), np.round(rng.random(n), int(rng.integers(1, 4)))     # ties included
        if len(set(y.tolist())) < 2:
            continue
        s = threshold_sweep(p, y)
        for by in ("accuracy", "macro_f1"):
            slow = np.array([metrics_at(p, y, t)[by] for t in s["threshold"]])
            np.testing.assert_allclose(s[by], slow, atol=1e-12)
            assert best_threshold(p, y, by) == s["threshold"][int(np.argmax(np.round(slow, 12)))]
        checked += 1
    assert checked > 15


def test_per_type_accuracy_counts_and_mcnemar_needs_pairs():
    preds = [{"id": "a", "prediction": 1, "label": 1}, {"id": "b", "prediction": 0, "label": 1},
             {"id": "c", "prediction": 0, "label": 0}]
    assert per_type_accuracy(preds, {"a": "001", "b": "001", "c": "000"}, with_n=True) == {"000": (1.0, 1), "001": (0.5, 2)}
    with pytest.raises(ValueError, match="pair them"):
        mcnemar([True, False], [True])
