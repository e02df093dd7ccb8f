"""Claims tables: a paired test per claim (one run, or cold runs pooled and clustered by item), its
minimum detectable difference at 80% power (exact McNemar by enumeration), the verdict rules, the
near-constant-arm flag, and the metrics.json keys of each row. The statistics themselves are
`lib.evaluation.metrics`.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Sequence

import numpy as np

from lib.evaluation.metrics import paired_accuracy_test, pooled_paired_test, run_spread, share_difference_test


# ----------------------------------------------------------------------------- power of the paired test
def mcnemar_power(n: int, discordance: float, difference: float, alpha: float = 0.05) -> float:
    """Power of the exact McNemar test (the two-sided binomial test on the discordant pairs, as
    `paired_accuracy_test` runs it, rejecting at p < alpha) for `n` paired items of which a share
    `discordance` is discordant, when the accuracy difference A - B is `difference`, by enumeration:
    the number of discordant items m ~ Binomial(n, discordance) and, given m, the items only A gets
    right ~ Binomial(m, (discordance + difference) / (2 discordance)); summed over the rejection region."""
    from scipy.stats import binom
    if n < 0 or not 0 <= discordance <= 1 or abs(difference) > discordance + 1e-12:
        raise ValueError(f"mcnemar_power: need n >= 0 and |difference| <= discordance <= 1 (n={n}, "
                         f"discordance={discordance}, difference={difference})")
    if n == 0 or discordance == 0:
        return 0.0
    q = min(1.0, max(0.0, (discordance + difference) / (2 * discordance)))
    m, kmax = _mcnemar_rejection(n, alpha)
    if len(m) == 0:
        return 0.0
    reject = binom.cdf(kmax, m, q) + binom.sf(m - kmax - 1, m, q)       # min(b, c) <= kmax, in either tail
    return float(min(1.0, np.sum(binom.pmf(m, n, discordance) * reject)))


@functools.lru_cache(maxsize=256)
def _mcnemar_rejection(n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """For each number of discordant items m <= n at which the exact test can reject: the largest
    min(b, c) whose two-sided binomial p is below alpha."""
    from scipy.stats import binom
    ms, ks = [], []
    for m in range(1, n + 1):
        k = np.arange(m // 2 + 1)
        ok = k[np.minimum(1.0, 2 * binom.cdf(k, m, 0.5)) < alpha]
        if len(ok):
            ms.append(m)
            ks.append(int(ok.max()))
    return np.array(ms, int), np.array(ks, int)


def mcnemar_mdd(n: int, discordance: float, power: float = 0.80, alpha: float = 0.05) -> float:
    """The minimum detectable difference: the smallest |A - B| that the exact McNemar test detects with
    probability `power` at `n` items and this discordance (bisection on `mcnemar_power`, which grows with
    the difference). NaN when no difference the discordance allows (at most the discordance itself)
    reaches that power: the test cannot see any effect of that discordance at this n."""
    if n <= 0 or discordance <= 0 or mcnemar_power(n, discordance, discordance, alpha) < power:
        return float("nan")
    lo, hi = 0.0, float(discordance)
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mcnemar_power(n, discordance, mid, alpha) < power else (lo, mid)
    return hi


#: the verdicts of a claims table, and their written rules (`verdict`)
VERDICTS = {
    "near-constant arm": "one arm gives one answer on at least 95% of the items: its accuracy is that label's share, "
                         "so the difference is not read as a test of the claim, whatever its p",
    "reproduced": "the effect is in the paper's direction, p < 0.05, and the positive control was detected",
    "not reproduced": "the positive control was detected and the difference's interval excludes the paper's effect",
    "underpowered": "the positive control was not detected, or the minimum detectable difference exceeds the "
                    "paper's effect",
    "mechanism absent in MemeWorld": "the method's precondition on MemeWorld's components is not met "
                                     "(lib/evaluation/preconditions.py: e.g. the captions carry nothing the encoder "
                                     "lacks), or the positive control's variant, where the ingredient carries the "
                                     "answer, falls short of the paper's effect itself and the claim's own "
                                     "difference is no significant one in the paper's direction: either way the "
                                     "claim cannot show here whatever the test's power (a finding about "
                                     "MemeWorld's components)",
    "inconclusive": "none of the above: the interval holds both no effect and the paper's effect",
    "reproduced, no control": "the effect is in the paper's direction with p < 0.05, but no positive control backs "
                              "it: none ran, or its oracle variant fell short of the paper's effect (then read the "
                              "difference with its arms: it is not the mechanism's, whose oracle could not make it)",
    "no test": "no positive control ran for this claim and p >= 0.05 (or the effect goes the other way): a null "
               "cannot be read either way",
}


def verdict(difference: float, ci_difference: tuple[float, float], p: float, paper_effect: float,
            mdd: float, control_detected: bool | str | None, near_constant: bool = False,
            precondition: bool | None = None) -> str:
    """A claim's verdict from its paired test (the difference A - B, its interval and p), the paper's
    effect (signed, in the same units; A is the paper's better arm, so it is positive), the test's minimum
    detectable difference, whether the positive control at the same n was detected (None: no
    control ran; SHORT: its oracle variant falls short of the paper's effect), whether an arm is a
    near-constant predictor and whether the method's precondition holds for the components the claim ran on
    (None: not measured). The rules are VERDICTS', checked in that order; an unmet precondition outranks every
    verdict but a reproduction."""
    if near_constant:
        return "near-constant arm"
    if control_detected is None or control_detected == SHORT:
        if difference > 0 and p < 0.05:
            return "reproduced, no control"
        return "no test" if control_detected is None and precondition is not False else "mechanism absent in MemeWorld"
    if control_detected and difference > 0 and p < 0.05:
        return "reproduced"
    if precondition is False:
        return "mechanism absent in MemeWorld"
    if control_detected and not (ci_difference[0] <= paper_effect <= ci_difference[1]):
        return "not reproduced"
    if not control_detected or not (mdd <= abs(paper_effect)):
        return "underpowered"
    return "inconclusive"


#: a positive control whose oracle variant falls short of the paper's effect on every item (`control_at_effect`)
SHORT = "short"


#: an arm giving one answer on at least this share of a claim's items is a near-constant predictor
NEAR_CONSTANT = 0.95


def constant_arm(name: str, answers: dict[str, Any] | None, items: Sequence[str]) -> str:
    """"" or a flag naming `name` as a near-constant predictor on `items`: one answer (no answer counts
    as one) on at least NEAR_CONSTANT of them. Its accuracy is then the share of that label among the
    items: a significant difference against it says little about moderation."""
    if not answers or not items:
        return ""
    vals = [answers.get(i) for i in items]
    label, count = collections.Counter(vals).most_common(1)[0]
    share = count / len(vals)
    if share < NEAR_CONSTANT:
        return ""
    said = "no answer" if label is None else f"label {label}"
    return f"{name} near-constant ({said} on {share:.0%})"


#: the effect a claim is held to where its paper publishes none: 0.10 in accuracy
DEFAULT_PAPER_EFFECT = 0.10
#: a claims table's column: where the paper's effect comes from
PAPERS_NUMBER = "paper's number"


@dataclasses.dataclass(frozen=True)
class PaperEffect:
    """What a claim's paper reports for A - B (accuracy, A its better arm) and where; `effect` None: the
    paper publishes no number for this comparison, and the claim is held to DEFAULT_PAPER_EFFECT."""
    effect: float | None = None
    source: str = ""

    @property
    def value(self) -> float:
        return DEFAULT_PAPER_EFFECT if self.effect is None else float(self.effect)

    @property
    def said(self) -> str:
        return self.source if self.effect is not None else f"none published: held to {DEFAULT_PAPER_EFFECT:.2f}"


def claim_row(claim: str, a: str, b: str, t: dict[str, Any], what: str, flag: str = "",
              paper: PaperEffect | None = None, control: bool | None = None,
              precondition: bool | None = None) -> dict[str, Any]:
    """One row of a claims table (notebooks 04 and 05): a paired test's result `t`
    (paired_accuracy_test, or pooled_paired_test over cold runs) for settings `a` and `b`, rounded
    for reading, the intervals as "[lo, hi]", the test's minimum detectable difference at 80% power
    (`mcnemar_mdd`: NaN where no difference of the observed discordance reaches it), `flag`
    (`constant_arm`: an arm that answers one label almost always), the paper's effect (`paper`; none:
    DEFAULT_PAPER_EFFECT) and the verdict (`verdict`; `control`: whether the claim's positive control
    was detected at the same n, None where none ran; `precondition`: whether the method's precondition holds
    for the components this claim ran on, None where not measured)."""
    ci = t.get("ci_difference", (float("nan"), float("nan")))
    paper = paper or PaperEffect()
    mdd = _mdd_of(t)
    return {"claim": claim, "A": a, "B": b, "n": t["n"], "runs": t.get("runs", 1),
            "acc A": round(t["acc_a"], 3), "95% CI A": f"[{t['ci_a'][0]:.2f}, {t['ci_a'][1]:.2f}]",
            "acc B": round(t["acc_b"], 3), "95% CI B": f"[{t['ci_b'][0]:.2f}, {t['ci_b'][1]:.2f}]",
            "A-B": round(t["difference"], 3), "95% CI A-B": f"[{ci[0]:.2f}, {ci[1]:.2f}]",
            "only A right": t["only_a_right"], "only B right": t["only_b_right"],
            "test": t.get("test", "exact McNemar"), "p": float(f"{t['p']:.3g}"),
            "MDD (80% power)": mdd, "majority line": round(t["majority_acc"], 3), "flag": flag or "none",
            "paper A-B": round(paper.value, 3), PAPERS_NUMBER: paper.said,
            "control": "none ran" if control is None else "oracle short of the effect" if control == SHORT
                       else "detected" if control else "not detected",
            "precondition": "not measured" if precondition is None else "met" if precondition else "not met",
            "verdict": verdict(t["difference"], ci, t["p"], paper.value, mdd, control, near_constant=bool(flag),
                               precondition=precondition),
            "what it isolates": what}


def _mdd_of(t: dict[str, Any]) -> float:
    """A claims row's minimum detectable difference (`mdd_from_counts`; pooled rows: the items whose run
    means differ, a conservative stand-in for the pooled test's own power)."""
    return mdd_from_counts(int(t["n"]), t["only_a_right"], t["only_b_right"])


def mdd_from_counts(n: int, only_a_right: int, only_b_right: int) -> float:
    """The exact McNemar test's minimum detectable difference at 80% power for `n` paired items and the
    observed discordance (the share of items one arm gets right and the other wrong), rounded to 3
    places. NaN: no difference the discordance allows reaches 80%."""
    mdd = mcnemar_mdd(n, (only_a_right + only_b_right) / n if n else 0.0)
    return round(mdd, 3) if mdd == mdd else float("nan")


# ----------------------------------------------------------------------------- a claim on two shares
# Some claims compare how often something happens on two different sets of items, not two arms on the same
# items: e.g. the share of emergent-hate posts a gate sends to Track II against the share of the other posts.
# Their test is Fisher's exact test (two-sided), their interval Newcombe's on the difference of the shares,
# their power by enumeration over the two binomials.

@functools.lru_cache(maxsize=64)
def _fisher_rejection(n_a: int, n_b: int, alpha: float) -> np.ndarray:
    """R[k_a, k_b]: whether Fisher's exact test (two-sided, as scipy.stats.fisher_exact computes it: the
    tables of the same margins no more probable than the observed one) rejects at p < alpha when k_a of n_a
    and k_b of n_b items are counted."""
    from scipy.stats import hypergeom
    out = np.zeros((n_a + 1, n_b + 1), bool)
    for total in range(n_a + n_b + 1):
        k = np.arange(max(0, total - n_b), min(n_a, total) + 1)
        pmf = hypergeom.pmf(k, n_a + n_b, total, n_a)
        p = np.array([pmf[pmf <= v * (1 + 1e-7)].sum() for v in pmf])
        out[k, total - k] = p < alpha
    return out


def fisher_power(n_a: int, n_b: int, share_b: float, difference: float, alpha: float = 0.05) -> float:
    """Power of Fisher's exact test for shares on `n_a` and `n_b` items when B's share is `share_b` and A's
    is `share_b + difference`, by enumeration: k_a ~ Binomial(n_a, share_b + difference) and k_b ~
    Binomial(n_b, share_b) independently, summed over the rejection region."""
    from scipy.stats import binom
    share_a = share_b + difference
    if n_a <= 0 or n_b <= 0 or not (0 <= share_b <= 1 and 0 <= share_a <= 1):
        raise ValueError(f"fisher_power: need n_a, n_b > 0 and shares in [0, 1] (n_a={n_a}, n_b={n_b}, "
                         f"share_b={share_b}, difference={difference})")
    pa, pb = binom.pmf(np.arange(n_a + 1), n_a, share_a), binom.pmf(np.arange(n_b + 1), n_b, share_b)
    return float(min(1.0, pa @ _fisher_rejection(n_a, n_b, alpha) @ pb))


def fisher_mdd(n_a: int, n_b: int, share_b: float, power: float = 0.80, alpha: float = 0.05) -> float:
    """The smallest rise of A's share over B's observed `share_b` that Fisher's exact test detects with
    probability `power` at these sizes (bisection on `fisher_power`); NaN when not even a share of 1 does."""
    if n_a <= 0 or n_b <= 0 or share_b >= 1 or fisher_power(n_a, n_b, share_b, 1 - share_b, alpha) < power:
        return float("nan")
    lo, hi = 0.0, 1.0 - share_b
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fisher_power(n_a, n_b, share_b, mid, alpha) < power else (lo, mid)
    return hi


def share_test(a: Sequence[bool], b: Sequence[bool], confidence: float = 0.95) -> dict[str, Any]:
    """Two shares on different items: A's (`a`: one bool per item) against B's (metrics.share_difference_test:
    Wilson intervals, Newcombe's on the difference, Fisher's exact p)."""
    return share_difference_test(int(sum(map(bool, a))), len(a), int(sum(map(bool, b))), len(b), confidence)


def share_row(claim: str, a: str, b: str, t: dict[str, Any], what: str, paper: PaperEffect | None = None,
              control: bool | None = None, precondition: bool | None = None) -> dict[str, Any]:
    """A claims-table row for `share_test`'s result, in claim_row's columns: "n" counts both sides' items,
    "acc A" and "acc B" hold the two shares, the MDD is `fisher_mdd`'s at B's observed share; the paired
    columns (only A right, only B right, majority line) stay empty."""
    paper = paper or PaperEffect()
    ci = t["ci_difference"]
    mdd = fisher_mdd(t["n_a"], t["n_b"], t["share_b"])
    mdd = round(mdd, 3) if mdd == mdd else float("nan")
    return {"claim": claim, "A": a, "B": b, "n": t["n_a"] + t["n_b"], "runs": 1,
            "acc A": round(t["share_a"], 3), "95% CI A": f"[{t['ci_a'][0]:.2f}, {t['ci_a'][1]:.2f}]",
            "acc B": round(t["share_b"], 3), "95% CI B": f"[{t['ci_b'][0]:.2f}, {t['ci_b'][1]:.2f}]",
            "A-B": round(t["difference"], 3), "95% CI A-B": f"[{ci[0]:.2f}, {ci[1]:.2f}]",
            "only A right": None, "only B right": None, "test": t["test"], "p": float(f"{t['p']:.3g}"),
            "MDD (80% power)": mdd, "majority line": None, "flag": "none",
            "paper A-B": round(paper.value, 3), PAPERS_NUMBER: paper.said,
            "control": "none ran" if control is None else "detected" if control else "not detected",
            "precondition": "not measured" if precondition is None else "met" if precondition else "not met",
            "verdict": verdict(t["difference"], ci, t["p"], paper.value, mdd, control, precondition=precondition),
            "what it isolates": what}


def share_control(claim: str, a: dict[str, bool], oracle: dict[str, bool], b: Sequence[bool], a_name: str,
                  b_name: str, paper: PaperEffect | None = None, confidence: float = 0.95,
                  items: str = "items") -> tuple[dict[str, Any], bool]:
    """A two-share claim's positive control and whether it was detected (Fisher's p < 0.05, A's share above
    B's): A's items with the `oracle`'s value (what a mechanism that works does: a gate that routes every
    emergent-hate post to Track II) put in on the fewest of them, in a seeded order, that lift A's share over
    B's by the paper's effect (`control_at_effect`), tested against the same B."""
    paper = paper or PaperEffect()
    share_a, share_b = float(np.mean([bool(v) for v in a.values()])), float(np.mean([bool(v) for v in b]))
    arm, k = control_at_effect(oracle, a, max(0.0, share_b + paper.value - share_a))
    t = share_test(list(arm.values()), list(b), confidence)
    found = bool(t["difference"] > 0 and t["p"] < 0.05)
    row = share_row(f"control: {claim}", f"{a_name}_at_effect", b_name, t,
                    f"{a_name}'s {items} with the oracle's value on {k} of {len(arm)}: the fewest that lift its share "
                    f"over {b_name}'s by the paper's effect", paper=paper)
    return {**row, "role": "control", "control": "—",
            "verdict": "control detected" if found else "control not detected"}, found


def cold_runs_of(name: str, names: Sequence[str]) -> list[str]:
    """`name` and its cold runs present in `names` (`<name>_run1`, `<name>_run2`, ...), in run order."""
    out, k = [name], 1
    while f"{name}_run{k}" in names:
        out.append(f"{name}_run{k}")
        k += 1
    return out


def first_present(arm: str, names) -> str | None:
    """A claim's arm: a name, or alternatives "a|b" (the first that ran: e.g. a variant run on the
    claim's own posts, else the main one)."""
    return next((x for x in arm.split("|") if x in names), None)


def claim_tests(claims: Sequence[tuple], correct: dict[str, dict[str, bool]],
                truth: dict[str, int], confidence: float = 0.95, answers: dict[str, dict[str, Any]] | None = None,
                controls: dict[str, bool] | None = None, preconditions: dict[str, bool] | None = None
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Claims tables' rows (notebooks 04 and 05). `claims`: (claim, A, B, what it isolates[, PaperEffect])
    with A and B names in `correct` (item -> right or wrong; "a|b": the first of them that ran); `controls`:
    claim -> whether its positive control was detected (absent: none ran); `preconditions`: claim -> whether
    the method's precondition holds for its components (absent: not measured). Each claim whose two arms ran gets its paired test
    on one run (exact McNemar); where both arms also have cold runs (`<name>_run<k>`), a second row
    pools the k runs both have, clustered by item (pooled_paired_test), and the second list gets one
    row per run (run_spread) with the claim's name: the distribution one run draws from. `answers`
    (name -> item -> the answer given, None for none): an arm answering one label almost always is
    flagged in the row (`constant_arm`)."""
    rows, spread = [], []
    answers, controls, preconditions = answers or {}, controls or {}, preconditions or {}
    for claim, a, b, what, *rest in claims:
        paper = rest[0] if rest else None
        a, b = first_present(a, correct), first_present(b, correct)
        if a is None or b is None or a == b:
            continue
        items = [i for i in correct[a] if i in correct[b]]
        flag = "; ".join(f for f in (constant_arm(a, answers.get(a), items), constant_arm(b, answers.get(b), items)) if f)
        control, pre = controls.get(claim), preconditions.get(claim)
        rows.append(claim_row(claim, a, b, paired_accuracy_test(correct[a], correct[b], truth, confidence), what, flag,
                              paper, control, pre))
        ra, rb = cold_runs_of(a, list(correct)), cold_runs_of(b, list(correct))
        k = min(len(ra), len(rb))
        if k > 1:
            runs_a, runs_b = [correct[x] for x in ra[:k]], [correct[x] for x in rb[:k]]
            rows.append(claim_row(f"{claim} ({k} cold runs pooled)", a, b,
                                  pooled_paired_test(runs_a, runs_b, truth, confidence), what, flag, paper, control,
                                  pre))
            spread += [{"claim": claim, "A": a, "B": b, **r} for r in run_spread(runs_a, runs_b, truth, confidence)]
    return rows, spread


def claim_metric_keys(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """metrics.json keys of each tested claim row: claim_<A>_vs_<B>_{n, acc_a, acc_b, p, majority}
    ("/" in a setting name becomes "_"; a row pooled over k > 1 cold runs ends its stem in _pooled
    and adds _runs); a row without a test (no p) is skipped."""
    m: dict[str, Any] = {}
    for row in rows:
        p = row.get("p")
        if p is None or p != p:
            continue
        runs = int(row.get("runs", 1) or 1)
        key = "claim_" + f"{row['A']}_vs_{row['B']}".replace("/", "_") + ("_pooled" if runs > 1 else "")
        m.update({f"{key}_n": int(row["n"]), f"{key}_acc_a": row["acc A"], f"{key}_acc_b": row["acc B"], f"{key}_p": p})
        majority = row.get("majority line")
        if majority is not None and majority == majority:          # a two-share row has no majority line
            m[f"{key}_majority"] = majority
        if runs > 1:
            m[f"{key}_runs"] = runs
    return m


def cold_run_metric_keys(spread_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """metrics.json keys of the per-run rows of claim_tests: for each claim's A vs B, the number of cold
    runs and their A-B difference's mean, sd (ddof 1), min and max (cold_<A>_vs_<B>_diff_...)."""
    by: dict[str, list[float]] = {}
    for r in spread_rows:
        by.setdefault("cold_" + f"{r['A']}_vs_{r['B']}".replace("/", "_"), []).append(float(r["difference"]))
    m: dict[str, Any] = {}
    for key, d in by.items():
        a = np.array(d, float)
        m.update({f"{key}_runs": len(a), f"{key}_diff_mean": float(a.mean()),
                  f"{key}_diff_sd": float(a.std(ddof=1)) if len(a) > 1 else float("nan"),
                  f"{key}_diff_min": float(a.min()), f"{key}_diff_max": float(a.max())})
    return m


def control_at_effect(oracle: dict[str, bool], base: dict[str, bool], effect: float,
                      seed: int = 0) -> tuple[dict[str, bool], int]:
    """A positive control's arm whose effect over `base` is the paper's `effect`, not a larger one: `base`'s
    right/wrong per item with the `oracle` arm's (a variant where the effect exists by construction: debaters
    that state the true cue, exemplars of the query's type) put in on the fewest items, taken in a seeded
    order, that lift its accuracy over `base` to `effect` or more. Returns the arm and how many items took
    the oracle's answer; where even every item falls short, the arm is the oracle's on all of them (its
    effect is then below the paper's, and the test is read on that)."""
    items = [i for i in base if i in oracle]
    if not items:
        raise ValueError("control_at_effect: the oracle and base arms share no item")
    order = sorted(items)
    np.random.default_rng(seed).shuffle(order)
    arm = {i: bool(base[i]) for i in items}
    need, gain = effect * len(items) - 1e-9, 0
    for k, i in enumerate(order, 1):
        if gain >= need:
            return arm, k - 1
        gain += int(bool(oracle[i])) - int(arm[i])
        arm[i] = bool(oracle[i])
    return arm, len(order)


def positive_controls(controls: Sequence[tuple], correct: dict[str, dict[str, bool]],
                      truth: dict[str, int], confidence: float = 0.95, items: str = "items"
                      ) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    """A claims table's control rows (they go before the claims) and claim -> whether its control was detected
    (the exact McNemar test's p < 0.05 in the oracle's direction), for each (claim, oracle arm, base arm[, the
    paper's effect: a PaperEffect]) of `controls` whose two arms ran ("a|b": the first that ran): the base arm's
    answers with the oracle's on the fewest items that reach the claim's paper effect (DEFAULT_PAPER_EFFECT where
    the paper publishes none; `control_at_effect`), tested against the base arm on the same items. An oracle arm
    short of that effect on every item is the control at its own effect; unless the test still detects it, the
    claim's control reads SHORT (the variant did not produce the effect: no test could)."""
    rows, detected = [], {}
    for claim, oracle, base, *published in controls:
        o, b = first_present(oracle, correct), first_present(base, correct)
        if o is None or b is None:
            continue
        paper = published[0] if published and published[0] is not None else PaperEffect()
        arm, k = control_at_effect(correct[o], correct[b], paper.value)
        t = paired_accuracy_test(arm, {i: correct[b][i] for i in arm}, truth, confidence)
        short = k == len(arm) and t["difference"] < paper.value - 1e-9
        detected[claim] = bool(t["difference"] > 0 and t["p"] < 0.05) or (SHORT if short else False)
        how = (f"{b}'s answers with {o}'s on all {len(arm)} {items}: the oracle falls short of the paper's effect"
               if short else f"{b}'s answers with {o}'s on {k} of {len(arm)} {items}: the fewest that lift it by the "
               f"paper's effect")
        row = claim_row(f"control: {claim}", f"{o}_at_effect", b, t, how, paper=paper)
        rows.append({**row, "role": "control", "control": "—",
                     "verdict": "control detected" if detected[claim] is True else
                                "oracle short of the effect" if detected[claim] == SHORT else "control not detected"})
    return rows, detected
