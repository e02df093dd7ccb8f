"""CLIP4DM's claims table (notebook 03): each claim compares two scores' average precision at ranking
original captions above foils on the same caption pairs, with a paired bootstrap over images (a foil and
its original share an image, so they are resampled together), its interval, p and minimum detectable
difference, beside a positive control at the same n: CLIPScore with a negative attribution planted on
the foil word, sized so that its AP gain is the paper's effect. If the test does not detect that, it
cannot read the claim either.

The columns are the 04/05 claims tables' (`lib.evaluation.claims`), with AP in place of accuracy.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lib.evaluation.claims import PAPERS_NUMBER, PaperEffect, verdict

#: the paper's nocaps-FOIL ablation (ViT-B/32): AP by CLIPScore alone 0.722, by the sum of negative
#: attributions 0.776, by F-CLIPScore 0.794
PAPER_AP = {"clip_score": 0.722, "sum_negative_attribution": 0.776, "f_clipscore": 0.794}
SCORE_NAMES = {"clip_score": "CLIPScore", "sum_negative_attribution": "sum of negative attributions",
               "f_clipscore": "F-CLIPScore", "planted": "planted foil-word attribution"}
#: z(0.975) + z(0.80): a normal test's minimum detectable difference at 80% power is this times its SE
MDD_Z = 2.8016
RESAMPLES = 1000


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim: score `a` (the paper's better one) against score `b` on `benchmark` (a results_<benchmark>.csv
    of `model`: "" for the main encoder's, else the folder of a further encoder), held to `paper`."""
    claim: str
    a: str
    b: str
    benchmark: str
    model: str
    paper: PaperEffect
    what: str


def _effect(a: str, b: str, where: str) -> PaperEffect:
    return PaperEffect(round(PAPER_AP[a] - PAPER_AP[b], 3),
                       f"{where}: AP {PAPER_AP[a]:.3f} vs {PAPER_AP[b]:.3f}")


#: the claims notebook 03 tests. FOIL has no published ablation: its rows are held to the nocaps one
CLIP4DM_CLAIMS: tuple[Claim, ...] = (
    Claim("F-CLIPScore ranks foils better than CLIPScore (nocaps-FOIL)", "f_clipscore", "clip_score", "nocaps_foil", "",
          _effect("f_clipscore", "clip_score", "nocaps ablation, B/32"),
          "what the attribution term adds to the global score, on the paper's ablation benchmark"),
    Claim("negative attributions alone rank foils better than CLIPScore (nocaps-FOIL)", "sum_negative_attribution",
          "clip_score", "nocaps_foil", "", _effect("sum_negative_attribution", "clip_score", "nocaps ablation, B/32"),
          "the attributions without the global score"),
    Claim("F-CLIPScore ranks foils better than CLIPScore (FOIL)", "f_clipscore", "clip_score", "foil", "",
          _effect("f_clipscore", "clip_score", "no FOIL ablation published: the nocaps one, B/32"),
          "the same on FOIL, where memeworld-clip saw every object in training"),
    Claim("F-CLIPScore ranks foils better than CLIPScore (FOIL, leak-free CLIP)", "f_clipscore", "clip_score", "foil",
          "memeworld-clip-leakfree", _effect("f_clipscore", "clip_score", "no FOIL ablation published: the nocaps one, B/32"),
          "the same on a CLIP that never trained on a test caption (FOIL hard negatives kept)"),
)


# ----------------------------------------------------------------------------- average precision, weighted
def weighted_average_precision(scores: np.ndarray, positive: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Average precision of `scores` ranking the `positive` items first, with each item counted `weights`
    times; `weights` is [n] or [B, n] (B weightings at once: a bootstrap's resample counts). Equals
    sklearn's average_precision_score(positive, scores, sample_weight=w) for every row, ties included
    (a threshold per distinct score)."""
    s, y = np.asarray(scores, float), np.asarray(positive, bool)
    w = np.atleast_2d(np.asarray(weights, float))
    order = np.argsort(-s, kind="mergesort")
    s, y, w = s[order], y[order], w[:, order]
    ends = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]      # the last item of each block of equal scores
    tp = np.cumsum(w * y, axis=1)[:, ends]
    fp = np.cumsum(w * ~y, axis=1)[:, ends]
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        recall = tp / tp[:, -1:]
    gain = np.diff(np.concatenate([np.zeros((len(w), 1)), recall], axis=1), axis=1)
    ap = np.sum(gain * precision, axis=1)
    return ap if np.ndim(weights) == 2 else ap[0]


def image_groups(frame: pd.DataFrame, benchmark: str) -> np.ndarray:
    """Each caption's resampling unit: its image (a foil and its original share one). FOIL's results carry the
    image's file name; nocaps-FOIL's ids are "<item>_foil" / "<item>_orig". Without either, each caption alone."""
    if "image" in frame.columns:
        keys = frame["image"].astype(str)
    elif benchmark.startswith("nocaps"):
        keys = frame["id"].astype(str).str.rsplit("_", n=1).str[0]
    else:
        keys = frame["id"].astype(str)
    return pd.factorize(keys)[0]


def paired_ap_test(score_a: Sequence[float], score_b: Sequence[float], positive: Sequence[bool],
                   groups: Sequence[int], resamples: int = RESAMPLES, seed: int = 0,
                   confidence: float = 0.95) -> dict[str, Any]:
    """AP(A) - AP(B) on the same captions with a paired bootstrap over `groups` (images, resampled with
    replacement, the same draws for both scores): the percentile interval, the two-sided bootstrap p
    (twice the smaller share of resampled differences on either side of zero, with the +1 correction), the
    bootstrap SE and the minimum detectable difference at 80% power of a two-sided normal test at 0.05
    (MDD_Z x SE)."""
    a, b = np.asarray(score_a, float), np.asarray(score_b, float)
    y, g = np.asarray(positive, bool), np.asarray(groups, int)
    if not (len(a) == len(b) == len(y) == len(g)) or len(a) == 0:
        raise ValueError(f"paired_ap_test: scores, labels and groups must be equally long and non-empty "
                         f"({len(a)}, {len(b)}, {len(y)}, {len(g)})")
    if y.all() or not y.any():
        raise ValueError("paired_ap_test: AP needs both originals and foils among the captions")
    n_groups = int(g.max()) + 1
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=resamples)
    w = counts[:, g].astype(float)
    ap_a, ap_b = float(weighted_average_precision(a, y, np.ones_like(a))), float(weighted_average_precision(b, y, np.ones_like(b)))
    boot = weighted_average_precision(a, y, w) - weighted_average_precision(b, y, w)
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    p = min(1.0, 2 * min((np.sum(boot <= 0) + 1) / (resamples + 1), (np.sum(boot >= 0) + 1) / (resamples + 1)))
    se = float(boot.std(ddof=1))
    return {"n": len(a), "images": n_groups, "ap_a": ap_a, "ap_b": ap_b, "difference": ap_a - ap_b,
            "ci_difference": (float(lo), float(hi)), "p": float(p), "se": se, "mdd": MDD_Z * se,
            "resamples": resamples, "test": f"paired bootstrap over images ({resamples} resamples)"}


# ----------------------------------------------------------------------------- the positive control
def planted(clip_score: Sequence[float], is_foil: Sequence[bool], target: float, seed: int = 0,
            tol: float = 5e-4) -> tuple[np.ndarray, float]:
    """The positive control's score: CLIPScore minus a negative attribution planted on each foil caption's
    foil word, lambda x u with u ~ Uniform(0, 1) per caption (seeded: a planted effect varies across
    captions, as a real one would), lambda chosen by bisection so that AP(planted) - AP(CLIPScore) =
    `target` (within `tol`). Pushing foils down only raises AP, so the gain grows with lambda.
    Returns the scores and lambda."""
    s, y = np.asarray(clip_score, float), np.asarray(is_foil, bool)
    u = np.random.default_rng(seed).uniform(size=len(s))
    orig, ones = ~y, np.ones(len(s))
    base = float(weighted_average_precision(s, orig, ones))
    if not 0 < target < 1 - base:
        raise ValueError(f"planted: an AP gain of {target} is out of reach from AP {base:.3f}")

    def gain(lam: float) -> float:
        return float(weighted_average_precision(s - lam * u * y, orig, ones)) - base

    lo, hi = 0.0, float(np.ptp(s)) or 1.0
    while gain(hi) < target:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        g = gain(mid)
        if abs(g - target) <= tol:
            return s - mid * u * y, mid
        lo, hi = (mid, hi) if g < target else (lo, mid)
    return s - hi * u * y, hi


# ----------------------------------------------------------------------------- the table
def _row(claim: str, a: str, b: str, t: dict[str, Any], paper: PaperEffect, control: bool | None, what: str,
         role: str) -> dict[str, Any]:
    ci = t["ci_difference"]
    mdd = round(t["mdd"], 3)
    return {"claim": claim, "role": role, "A": SCORE_NAMES.get(a, a), "B": SCORE_NAMES.get(b, b), "n": t["n"],
            "images": t["images"], "runs": 1, "metric": "AP (original captions first)",
            "AP A": round(t["ap_a"], 3), "AP B": round(t["ap_b"], 3), "A-B": round(t["difference"], 3),
            "95% CI A-B": f"[{ci[0]:.3f}, {ci[1]:.3f}]", "test": t["test"], "p": float(f"{t['p']:.3g}"),
            "MDD (80% power)": mdd, "paper A-B": round(paper.value, 3), PAPERS_NUMBER: paper.said,
            "control": "—" if role == "control" else ("none ran" if control is None else
                                                       "detected" if control else "not detected"),
            "verdict": (("control detected" if detected(t) else "control not detected") if role == "control" else
                        verdict(t["difference"], ci, t["p"], paper.value, mdd, control)),
            "what it isolates": what}


def detected(t: dict[str, Any]) -> bool:
    """A positive control is detected when its planted effect comes out positive with p < 0.05."""
    return t["difference"] > 0 and t["p"] < 0.05


def results_frame(stage_dir: Path | str, claim: Claim) -> pd.DataFrame | None:
    """The per-caption results a claim reads (None when that model or benchmark did not run)."""
    d = Path(stage_dir) / claim.model if claim.model else Path(stage_dir)
    f = d / f"results_{claim.benchmark}.csv"
    return pd.read_csv(f) if f.exists() else None


def claim_table(stage_dir: Path | str, claims: Sequence[Claim] = CLIP4DM_CLAIMS, resamples: int = RESAMPLES,
                seed: int = 0) -> pd.DataFrame:
    """Each claim whose results exist: its positive control's row (CLIPScore with the planted attribution
    against CLIPScore, the paper's effect, the same captions and test) and then the claim's row, whose
    verdict reads whether that control was detected (`lib.evaluation.claims.verdict`)."""
    rows = []
    for c in claims:
        f = results_frame(stage_dir, c)
        if f is None or f["is_foil"].nunique() < 2:
            continue
        y = f["is_foil"].astype(bool).to_numpy()
        orig, groups = ~y, image_groups(f, c.benchmark)
        control = None
        try:
            ctl_score, _ = planted(f[c.b].to_numpy(float), y, c.paper.value, seed=seed)
        except ValueError:                     # B already ranks so well that the paper's gain is out of reach
            ctl_score = None
        if ctl_score is not None:
            ctl = paired_ap_test(ctl_score, f[c.b], orig, groups, resamples, seed)
            control = detected(ctl)
            rows.append(_row(f"control: {c.claim}", "planted", c.b, ctl, c.paper, None,
                             f"{SCORE_NAMES[c.b]} with a planted foil-word attribution worth the paper's effect, "
                             "same captions and test", "control"))
        t = paired_ap_test(f[c.a], f[c.b], orig, groups, resamples, seed)
        rows.append(_row(c.claim, c.a, c.b, t, c.paper, control, c.what, "claim"))
    return pd.DataFrame(rows)


def claim_metrics(table: pd.DataFrame) -> dict[str, Any]:
    """metrics.json keys of the claims table: per claim (claim_<k>_...) and per control (control_<k>_...),
    k its place in CLIP4DM_CLAIMS order among those that ran: A-B, the interval's ends, p and MDD."""
    m: dict[str, Any] = {}
    k = {"claim": 0, "control": 0}
    for r in table.to_dict("records"):
        role = r["role"]
        k[role] += 1
        lo, hi = (float(x) for x in r["95% CI A-B"].strip("[]").split(","))
        m.update({f"{role}_{k[role]}_diff": r["A-B"], f"{role}_{k[role]}_ci_low": lo, f"{role}_{k[role]}_ci_high": hi,
                  f"{role}_{k[role]}_p": r["p"], f"{role}_{k[role]}_mdd": r["MDD (80% power)"],
                  f"{role}_{k[role]}_n": int(r["n"])})
    m["claims_detected_controls"] = int(sum(r["verdict"] == "control detected" for r in table.to_dict("records")))
    return m
