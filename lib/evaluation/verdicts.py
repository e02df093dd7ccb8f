"""The verdict rules, one source for the code and the legend: four verdicts, decided by the claim's own test after
the multiplicity correction across its family, and nothing else. Preconditions, component checks, controls,
baselines and near-constant arms have their own columns and their place in the reading; they never change a
verdict. Also here: the correction (Holm), the design's minimum detectable difference of each test, and the
seed-level test of a claim on retrained models.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: the verdicts, in the order they are checked, with the rule each states (the legend is this text)
VERDICTS = {
    "contradicted": "significant after the multiplicity correction, against the paper's direction",
    "reproduced": "significant after the correction, in the paper's direction",
    "reproduced, smaller than the paper": "significant after the correction, in the paper's direction, and the "
                                          "family-wise interval lies wholly below the paper's effect",
    "not reproduced": "the family-wise interval lies wholly below the paper's effect and nothing is significant in "
                      "its direction",
    "inconclusive": "anything else: the interval holds the paper's effect, or the test cannot tell (read the design's "
                    "minimum detectable difference beside the paper's effect)",
}
#: what the verdicts call the family-wise interval
FAMILY_INTERVAL = ("the family-wise interval: each claim's interval at confidence 1 - alpha/m (m the family's primary "
                   "claims; Bonferroni, so all of them hold together with probability at least 1 - alpha)")


def family_confidence(alpha: float, family_size: int) -> float:
    """The confidence of a claim's family-wise interval (FAMILY_INTERVAL)."""
    return 1 - alpha / max(1, family_size)


def verdict(difference: float, family_ci: tuple[float, float], p_adjusted: float, paper_effect: float,
            alpha: float = 0.05) -> str:
    """A primary claim's verdict from its test alone: the difference A - B (A the paper's better arm, so the paper's
    effect is positive), its family-wise interval (FAMILY_INTERVAL) and its p after the family's Holm correction
    (VERDICTS, in that order). Both the p and the interval are corrected for the family, so neither a false
    "reproduced" nor a false "not reproduced" is more likely than alpha across the whole table."""
    significant = p_adjusted == p_adjusted and p_adjusted < alpha
    if significant and difference < 0:
        return "contradicted"
    if significant and difference > 0:
        return "reproduced, smaller than the paper" if family_ci[1] < paper_effect else "reproduced"
    if family_ci[1] < paper_effect:
        return "not reproduced"
    return "inconclusive"


def decide(tests: Sequence[dict], alpha: float = 0.05) -> list[dict]:
    """A family's verdicts: `tests` holds each primary claim's {"p", "difference", "family_ci", "effect"}; returns
    each with "p_adjusted" (Holm across the family) and "verdict". The one decision path: the findings table and the
    simulation that proves the rules (tests/test_decision_rules.py) both call it."""
    adjusted = holm([t["p"] for t in tests])
    return [{**t, "p_adjusted": p, "verdict": verdict(t["difference"], t["family_ci"], p, t["effect"], alpha)}
            for t, p in zip(tests, adjusted)]


def legend() -> str:
    return "; ".join(f"*{v}*: {rule}" for v, rule in VERDICTS.items()) + f" ({FAMILY_INTERVAL})"


# ----------------------------------------------------------------------------- multiplicity
def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error at most alpha for any alpha); NaN stays NaN and
    takes no place in the family."""
    p = np.asarray(ps, float)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    out = np.full(len(p), np.nan)
    if m == 0:
        return out.tolist()
    order = ok[np.argsort(p[ok], kind="mergesort")]
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        out[i] = running
    return out.tolist()


# ----------------------------------------------------------------------------- the seed-level test
def seed_t_test(diffs: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """A claim on retrained models, decided on the seeds (the unit the randomness is in): the paired t-test of the
    per-seed differences A - B against zero, with its t interval. Fewer than two seeds: no test (NaN)."""
    from scipy import stats
    d = np.asarray(diffs, float)
    k = len(d)
    mean = float(d.mean()) if k else float("nan")
    if k < 2:
        return {"difference": mean, "ci_difference": (float("nan"), float("nan")), "p": float("nan"), "seeds": k,
                "sd": float("nan"), "test": f"paired t over {k} seeds"}
    sd = float(d.std(ddof=1))
    if sd == 0:          # every seed gave the same difference: no spread to test against (a 0 p would be no evidence)
        p = 1.0 if mean == 0 else float("nan")
        ci = (mean, mean) if mean == 0 else (float("nan"), float("nan"))
    else:
        t = mean / (sd / math.sqrt(k))
        p = float(2 * stats.t.sf(abs(t), k - 1))
        half = float(stats.t.ppf((1 + confidence) / 2, k - 1) * sd / math.sqrt(k))
        ci = (mean - half, mean + half)
    return {"difference": mean, "ci_difference": ci, "p": p, "seeds": k, "sd": sd,
            "test": f"paired t over {k} seeds"}


# ----------------------------------------------------------------------------- the design's minimum detectable difference
def design_discordance(acc_a: float, acc_b: float, observed: float) -> float:
    """The discordance a paired McNemar design is powered at: the larger of the observed share of items the arms
    disagree on and the share independent errors at these accuracies would give, a(1 - b) + b(1 - a). The observed
    discordance alone is the outcome, not the design (a run whose arms agree by chance would look powerless)."""
    indep = acc_a * (1 - acc_b) + acc_b * (1 - acc_a)
    return float(min(1.0, max(observed, indep)))


def seed_t_power(seeds: int, sd: float, difference: float, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test over `seeds` seeds whose per-seed differences have SD `sd`, at a true
    mean difference `difference` (the noncentral t)."""
    from scipy import stats
    if seeds < 2 or not sd > 0:
        return float("nan")
    df, nc = seeds - 1, difference / (sd / math.sqrt(seeds))
    crit = stats.t.ppf(1 - alpha / 2, df)
    upper, lower = stats.nct.sf(crit, df, nc), stats.nct.sf(crit, df, -nc)   # P(T > crit) + P(T < -crit)
    return float(np.nan_to_num(upper) + np.nan_to_num(lower))       # (scipy's nct.cdf is NaN far in a tail)


def seed_t_mdd(seeds: int, sd: float, power: float = 0.80, alpha: float = 0.05) -> float:
    """The smallest mean difference the seed-level t-test detects with `power` (bisection on `seed_t_power`)."""
    if seeds < 2 or not sd > 0:
        return float("nan")
    lo, hi = 0.0, 50 * sd
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if seed_t_power(seeds, sd, mid, alpha) < power else (lo, mid)
    return hi


#: z(1 - 0.05/2) + z(0.80): a two-sided normal test's minimum detectable difference at 80% power, in standard errors
NORMAL_MDD_Z = 2.8016


def normal_mdd(se: float, power: float = 0.80, alpha: float = 0.05) -> float:
    """A two-sided normal test's minimum detectable difference at `power` and `alpha` from its standard error."""
    from scipy import stats
    if se != se:
        return float("nan")
    return float((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) * se)
