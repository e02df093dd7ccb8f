"""Metrics shared by every system: thresholds, classification metrics, per-type accuracy, McNemar.

Every notebook that scores a binary moderator imports these, so "accuracy" or "the official
threshold" means the same thing in TRACE, the few-shot agents and the debate.
"""
from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np


def metrics_at(probs: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float]:
    """Accuracy, macro precision / recall / F1 at `threshold`, and AUROC (nan with one class)."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support, roc_auc_score
    probs, labels = np.asarray(probs, float), np.asarray(labels, int)
    pred = (probs >= threshold).astype(int)
    p, r, f, _ = precision_recall_fscore_support(labels, pred, average="macro", zero_division=0)
    auroc = roc_auc_score(labels, probs) if len(set(labels.tolist())) == 2 else float("nan")
    return {"accuracy": float(accuracy_score(labels, pred)), "macro_precision": float(p), "macro_recall": float(r),
            "macro_f1": float(f), "auroc": float(auroc)}


def threshold_sweep(probs: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Accuracy and macro-F1 at every candidate threshold (0.5 and each distinct probability, sorted),
    from cumulative counts: O(n log n) instead of one metrics call per candidate."""
    probs, labels = np.asarray(probs, float), np.asarray(labels, int)
    cands = np.unique(np.concatenate([[0.5], probs]))
    pos, neg = np.sort(probs[labels == 1]), np.sort(probs[labels == 0])
    tp = len(pos) - np.searchsorted(pos, cands, "left")        # predicted positive: prob >= threshold
    fp = len(neg) - np.searchsorted(neg, cands, "left")
    fn, tn = len(pos) - tp, len(neg) - fp
    acc = (tp + tn) / len(probs)
    with np.errstate(invalid="ignore", divide="ignore"):
        f_pos = np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0)
        f_neg = np.where(2 * tn + fn + fp > 0, 2 * tn / (2 * tn + fn + fp), 0.0)
    return {"threshold": cands, "accuracy": acc, "macro_f1": (f_pos + f_neg) / 2}


def best_threshold(probs: np.ndarray, labels: np.ndarray, by: str = "accuracy") -> float:
    """The threshold that maximises `by` (accuracy or macro_f1) on these (validation) predictions;
    ties go to the lowest candidate."""
    probs, labels = np.asarray(probs, float), np.asarray(labels, int)
    if len(set(labels.tolist())) < 2 or by not in ("accuracy", "macro_f1"):
        cands = np.unique(np.concatenate([[0.5], probs]))
        scores = [metrics_at(probs, labels, t)[by] for t in cands]
        return float(cands[int(np.argmax(scores))])
    s = threshold_sweep(probs, labels)
    return float(s["threshold"][int(np.argmax(np.round(s[by], 12)))])


def pr_best_f1_threshold(probs: np.ndarray, labels: np.ndarray) -> float:
    """The official TRACE rule: the point of the precision-recall curve with the highest F1 of the
    positive class (sklearn's `precision_recall_curve` thresholds; the curve's final point, which
    has no threshold, is left out; the first of equal F1s wins). Applied to the evaluation split
    itself it is optimistic; here it is only ever labelled so."""
    from sklearn.metrics import precision_recall_curve
    probs, labels = np.asarray(probs, float), np.asarray(labels, int)
    prec, rec, thr = precision_recall_curve(labels, probs)
    prec, rec = prec[:-1], rec[:-1]
    f1 = np.divide(2 * prec * rec, prec + rec, out=np.zeros_like(prec), where=(prec + rec) > 0)
    return float(thr[int(np.argmax(f1))])


def per_type_accuracy(predictions: list[dict[str, Any]], types: dict[str, str],
                      with_n: bool = False) -> dict[str, Any]:
    """Accuracy per interaction type of predictions {id, prediction, label}; with `with_n`, {type: (acc, n)}."""
    hit: dict[str, list[int]] = collections.defaultdict(list)
    for p in predictions:
        t = types.get(str(p["id"]))
        if t is not None:
            hit[t].append(int(p["prediction"] == p["label"]))
    if with_n:
        return {t: (float(np.mean(v)), len(v)) for t, v in sorted(hit.items())}
    return {t: float(np.mean(v)) for t, v in sorted(hit.items())}


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> dict[str, float]:
    """McNemar on paired correct/incorrect (statsmodels, exact=False, correction=True)."""
    from statsmodels.stats.contingency_tables import mcnemar as _mc
    a, b = np.asarray(correct_a, bool), np.asarray(correct_b, bool)
    if a.shape != b.shape:
        raise ValueError(f"mcnemar: the two methods were scored on {len(a)} and {len(b)} memes; pair them first")
    table = [[int((a & b).sum()), int((a & ~b).sum())], [int((~a & b).sum()), int((~a & ~b).sum())]]
    r = _mc(table, exact=False, correction=True)
    return {"statistic": float(r.statistic), "pvalue": float(r.pvalue), "b": table[0][1], "c": table[1][0]}
