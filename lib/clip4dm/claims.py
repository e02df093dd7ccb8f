"""CLIP4DM's claims table (notebook 03): each claim of the analysis plan (params/analysis/plan.yaml) compares two
scores' average precision at ranking original captions above foils on the same caption pairs, with a paired
bootstrap over images (a foil and its original share an image, so they are resampled together): its interval, p
and the design's minimum detectable difference (simulated from the bootstrap's resamples at the claim's n). Beside it, its positive
control, a score computed through the same formula from the oracle's attributions: CLIP4DM's own attribution at
the pair's swap position (the word a foil replaces, read in both captions of the pair) in place of the word the
attributions pick. It says whether the attributions carry the misalignment where it is; nothing is planted from the
labels. The columns are the other claims tables' (`lib.evaluation.claims.COLUMNS`), with AP in place of accuracy.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lib.evaluation import plan as analysis
from lib.evaluation.claims import PAPERS_NUMBER, PaperEffect, as_planned, table
from lib.evaluation.verdicts import NORMAL_MDD_Z, family_confidence

#: the paper's nocaps-FOIL ablation (ViT-B/32): AP by CLIPScore alone 0.722, by the sum of negative
#: attributions 0.776, by F-CLIPScore 0.794
PAPER_AP = {"clip_score": 0.722, "sum_negative_attribution": 0.776, "f_clipscore": 0.794}
SCORE_NAMES = {"clip_score": "CLIPScore", "sum_negative_attribution": "sum of negative attributions",
               "f_clipscore": "F-CLIPScore"}
#: z(0.975) + z(0.80): a normal test's minimum detectable difference at 80% power is this times its SE
MDD_Z = NORMAL_MDD_Z
RESAMPLES = 10000    # a bootstrap p that must pass a corrected threshold needs at least this many resamples


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
                   confidence: float = 0.95, family_confidence: float | None = None,
                   mdd_alpha: float = 0.05, power: float = 0.80) -> dict[str, Any]:
    """AP(A) - AP(B) on the same captions with a paired bootstrap over `groups` (images, resampled with
    replacement, the same draws for both scores): the percentile interval, the two-sided bootstrap p
    (twice the smaller share of resampled differences on either side of zero, with the +1 correction), the
    bootstrap SE and the minimum detectable difference at 80% power at this n, simulated from the resamples
    (`mdd_from_resamples`)."""
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
    fam = (np.quantile(boot, [(1 - family_confidence) / 2, (1 + family_confidence) / 2]) if family_confidence
           else (float("nan"), float("nan")))
    return {"n": len(a), "images": n_groups, "ap_a": ap_a, "ap_b": ap_b, "difference": ap_a - ap_b,
            "ci_difference": (float(lo), float(hi)), "ci_family": (float(fam[0]), float(fam[1])), "p": float(p),
            "se": se, "mdd": mdd_from_resamples(boot, power, mdd_alpha), "mdd_alpha": mdd_alpha,
            "resamples": resamples, "test": f"paired bootstrap over images ({resamples} resamples)"}


def mdd_from_resamples(boot: np.ndarray, power: float = 0.80, alpha: float = 0.05) -> float:
    """The smallest true difference the paired bootstrap detects with `power` at this claim's n, by simulation: the
    resampled differences, centred, are the estimate's sampling distribution at this n (the same images, the same
    scores); the test rejects where an estimate passes the centred distribution's upper alpha/2 quantile, so a true
    difference d is detected with probability P(d + e > q(1 - alpha/2)), e a centred resample. The MDD is the d
    where that reaches `power`: q(1 - alpha/2) - q(1 - power). For a normal e it is MDD_Z x SE."""
    e = np.asarray(boot, float) - float(np.mean(boot))
    hi, lo = np.quantile(e, [1 - alpha / 2, 1 - power])
    return float(hi - lo)


# ----------------------------------------------------------------------------- the positive control
#: each claim's A score computed from the oracle's attributions (the swap position's, results column
#: swap_attribution) through the same formula (lib.clip4dm.method.f_clipscore: attribution x (1 - CLIPScore / 2.5))
ORACLE = {"f_clipscore": "oracle F-CLIPScore", "sum_negative_attribution": "oracle attribution"}


def oracle_score(frame: pd.DataFrame, score: str) -> np.ndarray | None:
    """`score` recomputed from the swap position's attribution (None where the results lack it): the F-CLIPScore
    formula for F-CLIPScore, the attribution alone for the sum of negative attributions (each below zero, as the
    attributions CLIP4DM sums are)."""
    if "swap_attribution" not in frame.columns or score not in ORACLE:
        return None
    neg = np.minimum(frame["swap_attribution"].to_numpy(float), 0.0)
    return neg * (1.0 - frame["clip_score"].to_numpy(float) / 2.5) if score == "f_clipscore" else neg


# ----------------------------------------------------------------------------- the table
def _row(c, a: str, b: str, t: dict[str, Any], plan_digest: str, what: str, level: float) -> dict[str, Any]:
    ci, fam = t["ci_difference"], t["ci_family"]
    return {"id": c.id, "claim": c.statement, "role": c.role, "family": c.family, "A": a, "B": b, "unit": c.unit,
            "n": t["n"], "runs": 1, "as planned": as_planned(c, t["n"], 1), "acc A": round(t["ap_a"], 3),
            "95% CI A": "—", "acc B": round(t["ap_b"], 3), "95% CI B": "—", "A-B": round(t["difference"], 3),
            "95% CI A-B": f"[{ci[0]:.3f}, {ci[1]:.3f}]", "family-wise CI A-B": f"[{fam[0]:.3f}, {fam[1]:.3f}] ({level:.2%})",
            "only A right": None, "only B right": None, "test": t["test"], "p": float(f"{t['p']:.3g}"),
            "design MDD": round(t["mdd"], 3),
            "MDD rule": f"simulated at alpha {t['mdd_alpha']:.2g}: the centred bootstrap's quantiles at this n "
                        f"({t['resamples']} resamples over {t['images']} images)",
            "majority line": None, "flag": "none", "paper A-B": round(c.effect, 3), PAPERS_NUMBER: c.effect_said,
            "control": "—", "control test": "—", "control n": None, "control A-B": None, "control 95% CI": "—",
            "control p": None, "control status": "—",
            "baseline": "—", "baseline acc": None, "A-baseline": None, "baseline p": None,
            "precondition": "not measured", "component check": "none", "plan": plan_digest,
            "what it isolates": what}


def results_frame(stage_dir: Path | str, claim: Claim) -> pd.DataFrame | None:
    """The per-caption results a claim reads (None when that model or benchmark did not run)."""
    d = Path(stage_dir) / claim.model if claim.model else Path(stage_dir)
    f = d / f"results_{claim.benchmark}.csv"
    return pd.read_csv(f) if f.exists() else None


def claim_table(stage_dir: Path | str, claims: Sequence[Claim] = CLIP4DM_CLAIMS, resamples: int = RESAMPLES,
                seed: int = 0, plan=None) -> pd.DataFrame:
    """Each planned claim of notebook 03 whose results exist (its Claim here says which benchmark and model), tested
    by the paired bootstrap over images (`resamples`: at least 10,000 where the p must pass a corrected threshold),
    with its positive control beside it: the oracle's score (`oracle_score`) against the same B, same captions,
    same test."""
    plan = plan or analysis.load()
    by_statement = {c.claim: c for c in claims}
    rows = []
    for pc in plan.of("03_clip4dm", "claims.csv"):
        c = by_statement.get(pc.statement)
        f = results_frame(stage_dir, c) if c is not None else None
        if f is None or f["is_foil"].nunique() < 2:
            continue
        y = f["is_foil"].astype(bool).to_numpy()
        orig, groups = ~y, image_groups(f, c.benchmark)
        m = plan.family_sizes().get(pc.family, 1) if pc.role == "primary" else 1
        level = family_confidence(plan.alpha, m)
        t = paired_ap_test(f[c.a], f[c.b], orig, groups, resamples, seed, family_confidence=level,
                           mdd_alpha=plan.alpha / m, power=plan.power)
        row = _row(pc, SCORE_NAMES.get(c.a, c.a), SCORE_NAMES.get(c.b, c.b), t, plan.digest, c.what, level)
        oracle = oracle_score(f, c.a)
        if oracle is not None:
            ct = paired_ap_test(oracle, f[c.b], orig, groups, resamples, seed)
            row.update({"control test": ct["test"], "control n": ct["n"]})
            lo, hi = ct["ci_difference"]
            found = ct["difference"] > 0 and ct["p"] < plan.alpha
            row.update({"control": f"{ORACLE[c.a]} vs {SCORE_NAMES[c.b]}", "control A-B": round(ct["difference"], 3),
                        "control 95% CI": f"[{lo:.3f}, {hi:.3f}]", "control p": float(f"{ct['p']:.3g}"),
                        "control status": ("detected" if found else "not detected")
                                          + (", short of the paper's effect" if hi < pc.effect else "")})
        else:
            row["control"] = "the results hold no swap-position attribution"
        rows.append({**row, "images": t["images"]})
    frame = table(rows)
    if rows:
        frame.insert(frame.columns.get_loc("n") + 1, "images", [r["images"] for r in rows])
    return frame


def claim_metrics(table: pd.DataFrame) -> dict[str, Any]:
    """metrics.json keys of the claims table: per claim (claim_<k>_...) and its control (control_<k>_...), k the
    claim's plan id without its system (clip4dm.foil_fclip -> foil_fclip), so a key names the same claim whichever
    benchmarks ran: A-B, the interval's ends, p and the design's MDD."""
    m: dict[str, Any] = {}
    for r in table.to_dict("records"):
        k = str(r["id"]).split(".", 1)[-1]
        lo, hi = (float(x) for x in r["95% CI A-B"].strip("[]").split(","))
        m.update({f"claim_{k}_diff": r["A-B"], f"claim_{k}_ci_low": lo, f"claim_{k}_ci_high": hi,
                  f"claim_{k}_p": r["p"], f"claim_{k}_mdd": r["design MDD"], f"claim_{k}_n": int(r["n"])})
        if r.get("control A-B") is not None and r["control A-B"] == r["control A-B"]:
            m.update({f"control_{k}_diff": r["control A-B"], f"control_{k}_p": r["control p"]})
    m["claims_detected_controls"] = int(sum(str(r.get("control status", "")).startswith("detected")
                                            for r in table.to_dict("records")))
    return m
