"""The one metrics module: thresholds, accuracy and F1, per-type accuracy, bootstrap intervals,
McNemar and flip rates.

Every method scores through these (TRACE, CLIP4DM's accuracies, the few-shot agents, the debate,
the cross-method evaluation), so "accuracy", "macro-F1", "an unanswered item" or "the official
threshold" mean the same thing everywhere.
"""
from __future__ import annotations

import collections
import itertools
import warnings
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


def average_precision(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Average precision of `scores` ranking the `positive` items first (sklearn)."""
    from sklearn.metrics import average_precision_score
    return float(average_precision_score(np.asarray(positive, dtype=int), np.asarray(scores, dtype=float)))


def precision_recall_points(scores: Sequence[float], positive: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) along the ranking by `scores` (sklearn's precision_recall_curve), for plotting."""
    from sklearn.metrics import precision_recall_curve
    prec, rec, _ = precision_recall_curve(np.asarray(positive, dtype=int), np.asarray(scores, dtype=float))
    return prec, rec


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


def fill_unanswered(gold: Sequence[int], pred: Sequence[int | None]) -> list[int]:
    """Predictions with every unanswered one (None or a negative label) replaced by a label that
    is certainly wrong for its item (1 where the gold label is 0, else 0): an unanswered item
    counts as an error in every metric, never as a free abstention."""
    return [(1 if g == 0 else 0) if (p is None or p < 0) else int(p) for g, p in zip(gold, pred)]


def classification_report(gold: Sequence[int], pred: Sequence[int | None], labels: Sequence[int] | None = None,
                          positive: int | None = None) -> dict[str, Any]:
    """Accuracy, macro- and weighted-F1 of predicted class labels (unanswered ones are wrong, see
    `fill_unanswered`; sklearn with zero_division=0). `labels`: the classes the F1 averages run
    over (default: those present in gold or prediction). With `positive`, that class's
    precision, recall and F1 and the confusion matrix over `labels` (or [0, 1]) too.
    Empty input gives {}."""
    from sklearn.metrics import confusion_matrix, f1_score, precision_score, recall_score
    gold = [int(g) for g in gold]
    if not gold:
        return {}
    p = fill_unanswered(gold, pred)
    lab = list(labels) if labels is not None else None
    out: dict[str, Any] = {"accuracy": float(np.mean([g == y for g, y in zip(gold, p)])),
                           "macro_f1": float(f1_score(gold, p, average="macro", labels=lab, zero_division=0)),
                           "weighted_f1": float(f1_score(gold, p, average="weighted", labels=lab, zero_division=0))}
    if positive is not None:
        kw = {"average": "binary", "pos_label": positive, "zero_division": 0}
        out.update({"f1_positive": float(f1_score(gold, p, **kw)),
                    "precision_positive": float(precision_score(gold, p, **kw)),
                    "recall_positive": float(recall_score(gold, p, **kw)),
                    "confusion": confusion_matrix(gold, p, labels=lab or [0, 1]).tolist()})
    return out


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


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool], exact: bool = False) -> dict[str, float]:
    """McNemar on paired correct/incorrect (statsmodels; exact: the two-sided binomial test on the
    discordant pairs, for tens of memes; else the chi-square with continuity correction)."""
    from statsmodels.stats.contingency_tables import mcnemar as _mc
    a, b = np.asarray(correct_a, bool), np.asarray(correct_b, bool)
    if a.shape != b.shape:
        raise ValueError(f"mcnemar: the two methods were scored on {len(a)} and {len(b)} memes; pair them first")
    table = [[int((a & b).sum()), int((a & ~b).sum())], [int((~a & b).sum()), int((~a & ~b).sum())]]
    r = _mc(table, exact=exact, correction=True)
    return {"statistic": float(r.statistic), "pvalue": float(r.pvalue), "b": table[0][1], "c": table[1][0]}


# ----------------------------------------------------------------------------- uncertainty (notebook 06)
def _vec_accuracy(y, p, axis=-1):
    return np.mean(np.asarray(y) == np.asarray(p), axis=axis)


def _vec_macro_f1(y, p, axis=-1):
    """Macro-F1 of binary labels along the last axis (each row a resample); a class that is never
    predicted nor present scores 0, as sklearn's zero_division=0."""
    y, p = np.asarray(y, int), np.asarray(p, int)
    tp = np.sum((y == 1) & (p == 1), axis=axis)
    fp = np.sum((y == 0) & (p == 1), axis=axis)
    fn = np.sum((y == 1) & (p == 0), axis=axis)
    tn = np.sum((y == 0) & (p == 0), axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 0.0)
        f0 = np.where(2 * tn + fn + fp > 0, 2 * tn / np.maximum(2 * tn + fn + fp, 1), 0.0)
    return (f1 + f0) / 2


def _vec_auroc(y, s, axis=-1):
    """AUROC along the last axis from average ranks (Mann-Whitney U); nan where a row has one class."""
    from scipy.stats import rankdata
    y, s = np.asarray(y, int), np.asarray(s, float)
    r = rankdata(s, axis=-1)
    n1 = y.sum(axis=-1)
    n0 = y.shape[-1] - n1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n1 > 0) & (n0 > 0), ((r * y).sum(axis=-1) - n1 * (n1 + 1) / 2) / (n1 * n0), np.nan)


#: statistics a headline number can have, each vectorised over bootstrap resamples
STATISTICS = {"accuracy": (_vec_accuracy, "prediction"), "macro_f1": (_vec_macro_f1, "prediction"),
              "auroc": (_vec_auroc, "score")}


def bootstrap_ci(statistic, *arrays, n_resamples: int = 1000, confidence: float = 0.95, method: str = "percentile",
                 seed: int = 0) -> tuple[float, float, float]:
    """The statistic on the paired `arrays` (memes along the last axis) and its bootstrap CI
    (scipy.stats.bootstrap, paired resampling of memes, a fixed rng). Resamples where the statistic
    is undefined (AUROC of a one-class resample) are left out of the percentile interval.
    Returns (value, low, high); (value, nan, nan) with fewer than two memes."""
    from scipy import stats
    arrays = tuple(np.asarray(a) for a in arrays)
    value = float(statistic(*arrays, axis=-1))
    if arrays[0].shape[-1] < 2:
        return value, float("nan"), float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = stats.bootstrap(arrays, statistic, n_resamples=n_resamples, paired=True, vectorized=True,
                                  confidence_level=confidence, method=method, rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        dist = np.asarray(res.bootstrap_distribution, float)
        dist = dist[np.isfinite(dist)]
        if len(dist):
            a = (1 - confidence) / 2
            lo, hi = float(np.quantile(dist, a)), float(np.quantile(dist, 1 - a))
    return value, lo, hi


def mean_ci(values: Sequence[float], n_resamples: int = 1000, method: str = "BCa", seed: int = 0,
            confidence: float = 0.95) -> tuple[float, float, float, str]:
    """The mean of per-item scores (NaN left out) with its bootstrap CI: (mean, low, high, method
    used). BCa is undefined for constant samples and n < 2: constant samples fall back to the
    percentile method (a zero-width interval), n < 2 gives NaN bounds, and a BCa interval that
    comes out undefined is recomputed by percentile."""
    from scipy import stats
    v = np.asarray([x for x in values if x == x], dtype=float)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan"), "none"
    m = float(v.mean())
    if len(v) < 2:
        return m, float("nan"), float("nan"), "n<2"
    used = method
    if method.lower() == "bca" and np.all(v == v[0]):
        used = "percentile"
    res = stats.bootstrap((v,), np.mean, n_resamples=n_resamples, method=used, confidence_level=confidence,
                          rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (lo == lo and hi == hi):
        res = stats.bootstrap((v,), np.mean, n_resamples=n_resamples, method="percentile", confidence_level=confidence,
                              rng=np.random.default_rng(seed))
        lo, hi, used = float(res.confidence_interval.low), float(res.confidence_interval.high), "percentile"
    return m, lo, hi, used


PROPORTION_INTERVALS = {"wilson": "wilson", "exact": "beta", "clopper-pearson": "beta"}


def proportion_ci(successes: int, n: int, confidence: float = 0.95,
                  method: str = "wilson") -> tuple[float, float, float]:
    """A proportion k/n with its interval: "wilson" (score interval) or "exact" (Clopper-Pearson,
    statsmodels' "beta"). Both stay inside [0, 1] and are honest at small n, where a bootstrap of
    2 memes gives 1.000 [1.000, 1.000]. Returns (k/n, low, high); NaNs when n is 0."""
    from statsmodels.stats.proportion import proportion_confint
    if method not in PROPORTION_INTERVALS:
        raise ValueError(f"proportion_ci: method {method!r}; one of {sorted(PROPORTION_INTERVALS)}")
    if n <= 0:
        return float("nan"), float("nan"), float("nan")
    if not 0 <= successes <= n:
        raise ValueError(f"proportion_ci: {successes} successes out of {n}")
    lo, hi = proportion_confint(int(successes), int(n), alpha=1 - confidence, method=PROPORTION_INTERVALS[method])
    lo, hi = (0.0 if successes == 0 else max(0.0, lo)), (1.0 if successes == n else min(1.0, hi))
    return successes / n, float(lo), float(hi)


def share_difference_test(k_a: int, n_a: int, k_b: int, n_b: int, confidence: float = 0.95) -> dict[str, Any]:
    """Two shares on different items, k_a of n_a against k_b of n_b: each with its Wilson interval, the
    difference with Newcombe's hybrid score interval (statsmodels' "newcomb") and Fisher's exact p
    (two-sided). The unpaired counterpart of `paired_accuracy_test`."""
    from scipy.stats import fisher_exact
    from statsmodels.stats.proportion import confint_proportions_2indep
    if n_a <= 0 or n_b <= 0:
        raise ValueError(f"share_difference_test: an empty side ({n_a} and {n_b} items)")
    share_a, *ci_a = proportion_ci(k_a, n_a, confidence)
    share_b, *ci_b = proportion_ci(k_b, n_b, confidence)
    lo, hi = confint_proportions_2indep(k_a, n_a, k_b, n_b, method="newcomb", compare="diff", alpha=1 - confidence)
    return {"n_a": n_a, "n_b": n_b, "k_a": k_a, "k_b": k_b, "share_a": share_a, "share_b": share_b,
            "ci_a": tuple(ci_a), "ci_b": tuple(ci_b), "difference": share_a - share_b,
            "ci_difference": (float(lo), float(hi)),
            "p": float(fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue), "test": "Fisher exact (two shares)"}


def interval_keys(key: str, value: float | None, n: int | None, confidence: float = 0.95,
                  method: str = "wilson") -> dict[str, float]:
    """`{key}_ci_low` and `{key}_ci_high` for an accuracy `value` measured on `n` items (k = value * n),
    by proportion_ci: the metrics.json companions of an accuracy on a small sample. Empty when the
    value or n is missing."""
    if value is None or n is None or value != value or int(n) <= 0:
        return {}
    k = int(round(float(value) * int(n)))
    _, lo, hi = proportion_ci(k, int(n), confidence, method)
    return {f"{key}_ci_low": lo, f"{key}_ci_high": hi}


def cluster_ratio_ci(numerator: Sequence[float], denominator: Sequence[float], groups: Sequence[Any],
                     n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """sum(numerator) / sum(denominator) with a cluster bootstrap: whole groups (the copies of one
    meme) are resampled, never the rows inside them, so four copies of one meme count as one meme's
    evidence. Percentile interval; resamples with a zero denominator are left out.
    Returns (ratio, low, high); NaN bounds with fewer than two groups."""
    num, den = np.asarray(numerator, float), np.asarray(denominator, float)
    keys, inv = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    if not (len(num) == len(den) == len(inv)):
        raise ValueError(f"cluster_ratio_ci: {len(num)} numerators, {len(den)} denominators, {len(inv)} groups")
    gn, gd = np.bincount(inv, num, len(keys)), np.bincount(inv, den, len(keys))
    value = float(gn.sum() / gd.sum()) if gd.sum() else float("nan")
    if len(keys) < 2 or not gd.sum():
        return value, float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(keys), size=(n_resamples, len(keys)))
    sn, sd = gn[idx].sum(axis=1), gd[idx].sum(axis=1)
    ratios = sn[sd > 0] / sd[sd > 0]
    a = (1 - confidence) / 2
    return value, float(np.quantile(ratios, a)), float(np.quantile(ratios, 1 - a))


def metric_rows(frame, method: str, subsets: dict[str, Any], metrics: Sequence[str] = ("accuracy", "macro_f1", "auroc"),
                n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95, method_ci: str = "percentile",
                **extra) -> list[dict[str, Any]]:
    """Long-format rows (method, subset, metric, value, ci_low, ci_high, n, ci) of one method's
    predictions. `frame`: a DataFrame with id, label, prediction (0/1; missing answers count as
    wrong: the opposite of the label) and optionally score (for AUROC). `subsets`: name -> a
    boolean numpy mask over the frame or a collection of ids. AUROC is skipped where there is no score.
    `method_ci`: a bootstrap method ("percentile", "BCa", "basic") for every metric, or "wilson" /
    "exact" (Clopper-Pearson): accuracy, a proportion, then gets that interval and the other metrics
    the percentile bootstrap; the row's `ci` column names the interval used."""
    y = frame["label"].to_numpy(int)
    p = frame["prediction"].to_numpy(float)
    p = np.where(np.isnan(p), 1 - y, p).astype(int)          # no answer: wrong, whatever the label
    s = frame["score"].to_numpy(float) if "score" in frame and frame["score"].notna().all() else None
    ids = frame["id"].astype(str).to_numpy()
    rows = []
    for name, sel in subsets.items():
        if isinstance(sel, np.ndarray) and sel.dtype == bool:
            if len(sel) != len(frame):
                raise ValueError(f"metric_rows({method}): subset {name!r} masks {len(sel)} rows, "
                                 f"the frame has {len(frame)}")
            mask = sel
        else:
            mask = np.isin(ids, [str(i) for i in sel])
        if not mask.any():
            continue
        for m in metrics:
            fn, needs = STATISTICS[m]
            if needs == "score" and s is None:
                continue
            arrs = (y[mask], p[mask]) if needs == "prediction" else (y[mask], s[mask])
            if method_ci in PROPORTION_INTERVALS and m == "accuracy":
                v, lo, hi = proportion_ci(int((arrs[0] == arrs[1]).sum()), int(mask.sum()), confidence, method_ci)
                used = method_ci
            else:
                used = "percentile" if method_ci in PROPORTION_INTERVALS else method_ci
                v, lo, hi = bootstrap_ci(fn, *arrs, n_resamples=n_resamples, seed=seed, confidence=confidence,
                                         method=used)
            rows.append({"method": method, "subset": name, "metric": m, "value": v, "ci_low": lo, "ci_high": hi,
                         "n": int(mask.sum()), "ci": used, **extra})
    return rows


def _paired_difference_ci(a: np.ndarray, b: np.ndarray, confidence: float, n_resamples: int,
                          seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a) - mean(b) over items resampled whole (a and b are
    per-item values, or per-item means over runs: the resample is of items, so runs of one item
    stay together)."""
    n = len(a)
    if n == 0:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    d = (a.astype(float) - b.astype(float))[idx].mean(axis=1)
    tail = (1 - confidence) / 2
    return float(np.quantile(d, tail)), float(np.quantile(d, 1 - tail))


def exact_mcnemar_p(only_a: Any, only_b: Any) -> np.ndarray:
    """The exact McNemar p of paired tables from their discordant counts (items only A / only B got right): the
    two-sided binomial test of the discordant split against 1/2, vectorised over tables (equal to `mcnemar(...,
    exact=True)`, statsmodels' exact test; 1 where no item is discordant)."""
    from scipy import stats
    b, c = np.asarray(only_a, int), np.asarray(only_b, int)
    m = b + c
    return np.where(m > 0, np.minimum(1.0, 2 * stats.binom.cdf(np.minimum(b, c), np.maximum(m, 1), 0.5)), 1.0)


def _wilson_cc(k: np.ndarray, n: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval with continuity correction of k/n, vectorised (Newcombe 1998, his method 4)."""
    p = k / n
    lo = (2 * n * p + z * z - 1 - z * np.sqrt(np.maximum(z * z - 2 - 1 / n + 4 * p * (n * (1 - p) + 1), 0))) \
        / (2 * (n + z * z))
    hi = (2 * n * p + z * z + 1 + z * np.sqrt(np.maximum(z * z + 2 - 1 / n + 4 * p * (n * (1 - p) - 1), 0))) \
        / (2 * (n + z * z))
    return np.where(k == 0, 0.0, np.maximum(lo, 0.0)), np.where(k == n, 1.0, np.minimum(hi, 1.0))


def paired_difference_ci(both: Any, only_a: Any, only_b: Any, neither: Any,
                         confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe's interval for the difference of two paired proportions with continuity correction (his method 11,
    Stat Med 1998): each arm's continuity-corrected Wilson interval, combined through the paired table's phi
    correlation (items both / only A / only B / neither got right; phi's numerator corrected by n/2 towards zero),
    vectorised over tables. Deterministic, inside [-1, 1], honest at tens of items, and not anti-conservative at
    the family-wise level 1 - 0.05/26 (tests/test_decision_rules.py measures its coverage there)."""
    from scipy import stats
    a, b, c, d = (np.asarray(x, float) for x in (both, only_a, only_b, neither))
    n = a + b + c + d
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = _wilson_cc(a + b, n, z)
    l2, u2 = _wilson_cc(a + c, n, z)
    den = np.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    num = a * d - b * c
    num = np.where(num > n / 2, num - n / 2, np.where(num < 0, num, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
    delta = p1 - p2
    lo = delta - np.sqrt(np.maximum((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0))
    hi = delta + np.sqrt(np.maximum((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0))
    return np.maximum(lo, -1.0), np.minimum(hi, 1.0)


def paired_accuracy_test(correct_a: dict[str, bool], correct_b: dict[str, bool], truth: dict[str, int],
                         confidence: float = 0.95) -> dict[str, Any]:
    """Two variants on the items both judged: each accuracy with its Wilson interval, the difference with
    Newcombe's continuity-corrected paired interval (`paired_difference_ci`), and the exact McNemar test (a two-sided binomial test on
    the discordant items, which is what a sample of tens of items needs); the majority-class line of those items."""
    ids = [i for i in correct_a if i in correct_b]
    a = np.array([correct_a[i] for i in ids], bool)
    b = np.array([correct_b[i] for i in ids], bool)
    n = len(ids)
    acc_a, lo_a, hi_a = proportion_ci(int(a.sum()), n, confidence)
    acc_b, lo_b, hi_b = proportion_ci(int(b.sum()), n, confidence)
    cells = [int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum()), int((~a & ~b).sum())]
    only_a, only_b = cells[1], cells[2]
    p = float(exact_mcnemar_p(only_a, only_b)) if n else float("nan")
    lo, hi = paired_difference_ci(*cells, confidence) if n else (float("nan"), float("nan"))
    labels = collections.Counter(truth[i] for i in ids)
    return {"n": n, "runs": 1, "acc_a": acc_a, "ci_a": (lo_a, hi_a), "acc_b": acc_b, "ci_b": (lo_b, hi_b),
            "difference": acc_a - acc_b if n else float("nan"), "ci_difference": (float(lo), float(hi)),
            "only_a_right": only_a, "only_b_right": only_b, "test": "exact McNemar", "p": p, "mcnemar_exact_p": p,
            "majority_acc": labels.most_common(1)[0][1] / n if n else float("nan")}


def sign_flip_p(d: np.ndarray, n_resamples: int = 20000, seed: int = 0) -> float:
    """Two-sided randomization test that per-item differences `d` are centred on zero: each item's
    sign flipped at random (what exchangeability of A and B within an item allows), the statistic
    |sum d|. Exact over every sign pattern when at most 16 items differ; otherwise `n_resamples`
    seeded draws, p = (1 + as extreme) / (1 + draws)."""
    d = np.asarray(d, float)
    d = d[d != 0]
    if len(d) == 0:
        return 1.0
    obs = abs(d.sum()) - 1e-12
    if len(d) <= 16:
        signs = np.array(list(itertools.product((1, -1), repeat=len(d))), float)
        return float(np.mean(np.abs(signs @ d) >= obs))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n_resamples, len(d)))
    return float((1 + np.sum(np.abs(signs @ d) >= obs)) / (1 + n_resamples))


def pooled_paired_test(runs_a: Sequence[dict[str, bool]], runs_b: Sequence[dict[str, bool]], truth: dict[str, int],
                       confidence: float = 0.95, n_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Two variants each run several times (cold runs: the same items asked afresh) on the items every
    run of both judged, pooled over runs and clustered by item: each arm's accuracy over items x runs
    with a bootstrap interval over items, the difference with its bootstrap interval (items resampled
    whole, so an item's runs stay together), and the sign-flip randomization test on the per-item
    differences of the run means (`sign_flip_p`). Runs that repeat one answer add no evidence: the
    test's unit is the item. `only_a_right` / `only_b_right`: items whose run means favour A / B."""
    ids = [i for i in runs_a[0] if all(i in r for r in (*runs_a, *runs_b))]
    a = np.array([[r[i] for i in ids] for r in runs_a], float).mean(axis=0) if ids else np.zeros(0)
    b = np.array([[r[i] for i in ids] for r in runs_b], float).mean(axis=0) if ids else np.zeros(0)
    n = len(ids)
    d = a - b
    tail = (1 - confidence) / 2

    def arm_ci(x: np.ndarray) -> tuple[float, float]:
        if n == 0:
            return float("nan"), float("nan")
        m = x[np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))].mean(axis=1)
        return float(np.quantile(m, tail)), float(np.quantile(m, 1 - tail))

    labels = collections.Counter(truth[i] for i in ids)
    return {"n": n, "runs": min(len(runs_a), len(runs_b)), "acc_a": float(a.mean()) if n else float("nan"),
            "ci_a": arm_ci(a), "acc_b": float(b.mean()) if n else float("nan"), "ci_b": arm_ci(b),
            "difference": float(d.mean()) if n else float("nan"),
            "ci_difference": _paired_difference_ci(a, b, confidence, n_resamples, seed),
            "only_a_right": int((d > 0).sum()), "only_b_right": int((d < 0).sum()),
            "test": f"sign-flip over items, {min(len(runs_a), len(runs_b))} runs pooled",
            "p": sign_flip_p(d, 2 * n_resamples, seed), "item_diffs": d.tolist(),
            "majority_acc": labels.most_common(1)[0][1] / n if n else float("nan")}


def run_spread(runs_a: Sequence[dict[str, bool]], runs_b: Sequence[dict[str, bool]], truth: dict[str, int],
               confidence: float = 0.95) -> list[dict[str, Any]]:
    """One row per cold run k (run k of A against run k of B, on the items every run of both judged):
    both accuracies, the difference and the exact McNemar p: the distribution a single run draws from."""
    ids = {i for i in runs_a[0] if all(i in r for r in (*runs_a, *runs_b))}
    rows = []
    for k, (ra, rb) in enumerate(zip(runs_a, runs_b)):
        t = paired_accuracy_test({i: ra[i] for i in ra if i in ids}, {i: rb[i] for i in rb if i in ids}, truth,
                                 confidence)
        rows.append({"run": k, "n": t["n"], "acc_a": t["acc_a"], "acc_b": t["acc_b"], "difference": t["difference"],
                     "only_a_right": t["only_a_right"], "only_b_right": t["only_b_right"], "p": t["p"]})
    return rows


def pairwise_mcnemar(correct: dict[str, Sequence[bool]], correction: str = "holm", alpha: float = 0.05,
                     exact: bool | None = None, reference: str | None = None):
    """McNemar (`mcnemar`) for every pair of methods scored on the same memes, or for `reference`
    against each other method, p-values corrected for the number of pairs (statsmodels
    `multipletests`: holm by default, bonferroni, ...). exact None: the exact binomial test where the
    discordant pairs are fewer than 25, else the chi-square with continuity correction. Returns a
    DataFrame: a, b, acc_a, acc_b, b_only (a right, b wrong), c_only, test, statistic, pvalue,
    p_adjusted, significant."""
    import pandas as pd
    from statsmodels.stats.multitest import multipletests
    arr = {k: np.asarray(v, bool) for k, v in correct.items()}
    sizes = {len(v) for v in arr.values()}
    if len(sizes) > 1:
        raise ValueError(f"pairwise_mcnemar: methods were scored on different numbers of memes {sorted(sizes)}")
    if reference is not None and reference not in arr:
        raise KeyError(f"pairwise_mcnemar: reference {reference!r} is not among {', '.join(arr)}")
    pairs = (itertools.combinations(list(arr), 2) if reference is None
             else [(reference, k) for k in arr if k != reference])
    rows = []
    for a, b in pairs:
        x, z = arr[a], arr[b]
        ex = int((x != z).sum()) < 25 if exact is None else exact
        r = mcnemar(x, z, exact=ex)
        rows.append({"a": a, "b": b, "acc_a": float(x.mean()), "acc_b": float(z.mean()), "b_only": r["b"],
                     "c_only": r["c"], "test": "exact" if ex else "chi2", "statistic": r["statistic"],
                     "pvalue": r["pvalue"]})
    df = pd.DataFrame(rows)
    if len(df):
        rej, padj, _, _ = multipletests(df["pvalue"].to_numpy(), alpha=alpha, method=correction)
        df["p_adjusted"], df["significant"] = padj, rej
    return df


def flip_rate(original: Sequence[Any], injected: Sequence[Any], n_resamples: int = 1000, seed: int = 0,
              confidence: float = 0.95, groups: Sequence[Any] | None = None,
              interval: str = "auto") -> dict[str, float]:
    """Prompt-injection flip rate over paired (original, injected) predictions of hateful memes:
    among the copies whose original meme a method called hateful, the share it calls non-hateful
    once the instruction is added (an unanswered or unparseable injected copy is not a flip); also
    the hateful recall before and after (unanswered = missed), and the other direction
    (`reverse_flip_rate`): among the copies whose original a method called non-hateful, the share it
    calls hateful once the instruction is added (an instruction can push a model either way).

    `groups`: the source meme of each pair. Copies of one meme are not independent, so the
    interval ("auto") is a cluster bootstrap over memes when some meme has several copies, and the
    Wilson score interval when every meme has one copy (exact at small n, where a bootstrap of 2
    memes collapses to [1, 1]). `interval`: "auto", "wilson", "exact" or "cluster"."""
    o = np.array([np.nan if v is None else float(v) for v in original])
    j = np.array([np.nan if v is None else float(v) for v in injected])
    if o.shape != j.shape:
        raise ValueError(f"flip_rate: {len(o)} original and {len(j)} injected predictions; pair them first")
    g = np.asarray([str(x) for x in (range(len(o)) if groups is None else groups)])
    if len(g) != len(o):
        raise ValueError(f"flip_rate: {len(g)} groups for {len(o)} pairs")
    base = o == 1
    flips = (j[base] == 0)
    out = {"n_pairs": int(len(o)), "n_called_hateful": int(base.sum()),
           "n_memes_called_hateful": int(len(set(g[base]))),
           "recall_original": float(np.mean(o == 1)) if len(o) else float("nan"),
           "recall_injected": float(np.mean(j == 1)) if len(j) else float("nan"),
           "n_unanswered_injected": int(np.isnan(j).sum())}
    if interval not in ("auto", "cluster", *PROPORTION_INTERVALS):
        raise ValueError(f"flip_rate: interval {interval!r}; one of auto, cluster, wilson, exact")

    def rate(flag: np.ndarray, groups: np.ndarray) -> tuple[float, float, float, str]:
        repeated = len(set(groups)) < len(groups)
        used = ("cluster" if repeated else "wilson") if interval == "auto" else interval
        if not len(flag):
            return float("nan"), float("nan"), float("nan"), used
        if used == "cluster":
            return (*cluster_ratio_ci(flag.astype(float), np.ones(len(flag)), groups, n_resamples, confidence, seed), used)
        return (*proportion_ci(int(flag.sum()), len(flag), confidence, used), used)
    v, lo, hi, used = rate(flips, g[base])
    out.update({"flip_rate": v, "ci_low": lo, "ci_high": hi, "ci": used})
    benign = o == 0
    rv, rlo, rhi, _ = rate(j[benign] == 1, g[benign])
    out.update({"n_called_not_hateful": int(benign.sum()), "reverse_flip_rate": rv, "reverse_ci_low": rlo,
                "reverse_ci_high": rhi})
    return out
