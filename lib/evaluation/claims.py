"""Claims tables: each claim of the analysis plan (lib.evaluation.plan) tested with its unit's test (an exact
McNemar on one run, a sign-flip on per-item means of cold runs, a paired t over seeds), its secondary tests, the
design's minimum detectable difference, its control (a pipeline arm where the ingredient carries the signal, tested
against the claim's B arm) and baseline (the no-model arm, against A), the near-constant-arm flag, and the
metrics.json keys of each row. Verdicts need the family's correction: lib.compendium.findings gives them
(lib.evaluation.verdicts holds the rules). The statistics themselves are `lib.evaluation.metrics`.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Any, Sequence

import numpy as np

from lib.evaluation.metrics import paired_accuracy_test, pooled_paired_test, run_spread, share_difference_test  # noqa: F401
from lib.evaluation.verdicts import design_discordance, family_confidence, normal_mdd, seed_t_mdd, seed_t_test


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


def claim_metric_keys(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """metrics.json keys of each tested claims-table row: claim_<A>_vs_<B>_{n, acc_a, acc_b, p, majority, runs} for a
    claim's primary test, claim_<A>_vs_<B>_s<k>_... for its k-th secondary test, and claim_<A>_vs_<B>_control_{diff,
    p} for its control ("/" in a setting name becomes "_"); a row without a test (no p) is skipped."""
    m: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for row in rows:
        p = row.get("p")
        if p is None or p != p or row.get("role") not in ("primary", "secondary"):
            continue
        stem = "claim_" + f"{row['A']}_vs_{row['B']}".replace("/", "_")
        if row["role"] == "secondary":
            seen[stem] = seen.get(stem, 0) + 1
            key = f"{stem}_s{seen[stem]}"
        else:
            key = stem
        m.update({f"{key}_n": int(row["n"]), f"{key}_acc_a": row["acc A"], f"{key}_acc_b": row["acc B"], f"{key}_p": p,
                  f"{key}_runs": int(row.get("runs") or 1)})
        majority = row.get("majority line")
        if majority is not None and majority == majority:          # a two-share row has no majority line
            m[f"{key}_majority"] = majority
        ctl = row.get("control A-B")
        if row["role"] == "primary" and ctl is not None and ctl == ctl:
            m.update({f"{key}_control_diff": ctl, f"{key}_control_p": row.get("control p")})
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


# ----------------------------------------------------------------------------- the plan's claims, tested
#: a claims table's columns, every stage's (CLIP4DM's hold AP in the accuracy columns, a two-share row shares)
COLUMNS = ("id", "claim", "role", "family", "A", "B", "unit", "n", "runs", "as planned", "acc A", "95% CI A", "acc B",
           "95% CI B", "A-B", "95% CI A-B", "family-wise CI A-B", "only A right", "only B right", "test", "p",
           "design MDD", "MDD rule", "majority line", "flag", "paper A-B", PAPERS_NUMBER, "control", "control test",
           "control n", "control A-B", "control 95% CI", "control p", "control status", "baseline", "baseline acc",
           "A-baseline", "baseline p", "precondition", "component check", "plan", "what it isolates")


def as_planned(c, n: int, runs: int) -> str:
    """Whether a claim's test ran as its plan says: "yes", or what differs (its n, its runs). The findings table gives
    no verdict to a claim that did not."""
    out = []
    if int(n) != int(c.n):
        out.append(f"n {int(n)} where the plan says {c.n}")
    if c.unit in ("seeds", "cold runs", "seeds pooled") and int(runs or 1) < int(c.runs):
        out.append(f"{int(runs or 1)} of the plan's {c.runs} runs")
    return "; ".join(out) or "yes"


def _ci(pair) -> str:
    lo, hi = pair
    return "—" if lo != lo else f"[{lo:.3f}, {hi:.3f}]"


def _restrict(correct: dict[str, bool], items: set[str]) -> dict[str, bool]:
    return {i: v for i, v in correct.items() if i in items}


def _acc(c: dict[str, bool], items: Sequence[str]) -> float:
    return float(np.mean([c[i] for i in items])) if items else float("nan")


def arm_test(unit: str, a: str, b: str, correct: dict[str, dict[str, bool]], truth: dict[str, int],
             items: set[str], confidence: float = 0.95, runs: int | None = None) -> dict[str, Any]:
    """Arm `a` against arm `b` on `items` with the test of `unit` (lib.evaluation.plan.UNITS): "items", the exact
    McNemar on the single run; "cold runs" and "seeds pooled", the sign-flip over items on each item's mean over the
    runs both arms have (`<name>_run<k>`: cold runs, or seeds); "seeds", the paired t-test over the per-seed accuracy
    differences (lib.evaluation.verdicts.seed_t_test), the seed the unit. `runs`: at most this many runs."""
    names = list(correct)
    ra, rb = cold_runs_of(a, names), cold_runs_of(b, names)
    k = min(len(ra), len(rb), runs or 10 ** 6)
    ids = sorted(i for i in items if all(i in correct[x] for x in (*ra[:k], *rb[:k])))
    if unit == "items" or k < 2:
        t = paired_accuracy_test(_restrict(correct[a], set(ids)), _restrict(correct[b], set(ids)), truth, confidence)
        if unit != "items":
            t["test"] = f"exact McNemar (only {k} run of each arm: no {unit} to pool)"
        return t
    if unit in ("cold runs", "seeds pooled"):
        return pooled_paired_test([_restrict(correct[x], set(ids)) for x in ra[:k]],
                                  [_restrict(correct[x], set(ids)) for x in rb[:k]], truth, confidence)
    if unit != "seeds":
        raise ValueError(f"arm_test: unit {unit!r} is not a paired-accuracy unit")
    acc_a = [_acc(correct[x], ids) for x in ra[:k]]
    acc_b = [_acc(correct[x], ids) for x in rb[:k]]
    t = seed_t_test(np.subtract(acc_a, acc_b), confidence)
    arm_a, arm_b = seed_t_test(acc_a, confidence), seed_t_test(acc_b, confidence)
    labels = collections.Counter(truth[i] for i in ids)
    return {"n": len(ids), "runs": k, "acc_a": float(np.mean(acc_a)), "ci_a": arm_a["ci_difference"],
            "acc_b": float(np.mean(acc_b)), "ci_b": arm_b["ci_difference"], "difference": t["difference"],
            "ci_difference": t["ci_difference"], "only_a_right": None, "only_b_right": None, "test": t["test"],
            "p": t["p"], "sd": t["sd"], "per_seed": list(np.subtract(acc_a, acc_b)),
            "majority_acc": labels.most_common(1)[0][1] / len(ids) if ids else float("nan")}


def design_mdd(unit: str, t: dict[str, Any], alpha: float = 0.05, power: float = 0.80) -> tuple[float, str]:
    """The smallest difference a claim's test detects with `power` at its design (n, runs, the arms' accuracies) and
    level `alpha` (a primary claim's: Holm's strictest threshold, the family's alpha / m), and the rule it comes from.
    Every rule takes the larger of the observed spread and the one independent errors at these accuracies would give,
    so a run whose arms happen to agree does not look powerful."""
    n = int(t["n"])
    level = f"at alpha {alpha:.2g}"
    if t["test"].startswith("paired t over"):
        floor = math.sqrt((t["acc_a"] * (1 - t["acc_a"]) + t["acc_b"] * (1 - t["acc_b"])) / n) if n else float("nan")
        sd = max(float(t["sd"]), floor) if t["sd"] == t["sd"] else floor
        return (round(seed_t_mdd(int(t["runs"]), sd, power, alpha), 3),
                f"paired t over {t['runs']} seeds {level}, per-seed SD {sd:.3f} (the larger of the observed "
                f"{t['sd']:.3f} and independent errors' {floor:.3f})")
    if t["test"].startswith("sign-flip"):
        d_var = float(np.var(t["item_diffs"], ddof=1)) if len(t.get("item_diffs", [])) > 1 else float("nan")
        floor = design_discordance(t["acc_a"], t["acc_b"], 0.0) / max(1, int(t["runs"]))
        var = max(d_var, floor) if d_var == d_var else floor
        return (round(normal_mdd(math.sqrt(var / n), power, alpha), 3) if n else float("nan"),
                f"normal approximation {level}, per-item differences' variance {var:.3f} (the larger of the observed "
                f"and independent errors' over {t['runs']} runs)")
    if t["test"].startswith("exact McNemar"):
        observed = ((t["only_a_right"] or 0) + (t["only_b_right"] or 0)) / n if n else 0.0
        disc = design_discordance(t["acc_a"], t["acc_b"], observed)
        mdd = mcnemar_mdd(n, disc, power, alpha)
        return (round(mdd, 3) if mdd == mdd else float("nan"),
                f"exact McNemar at n = {n} {level}, discordance {disc:.2f} (the larger of the observed "
                f"{observed:.2f} and independent errors')")
    if "se" in t:
        return round(normal_mdd(float(t["se"]), power, alpha), 3), f"normal approximation {level} from the bootstrap's SE"
    return float("nan"), "none"


def _p(v: float) -> float:
    return float(f"{v:.3g}") if v == v else float("nan")


def _arms_row(c, role: str, a: str, b: str, t: dict[str, Any], unit: str, what: str, plan_digest: str,
              alpha: float, power: float, main: bool = True, family_ci=(float("nan"), float("nan")),
              family_level: float | None = None) -> dict[str, Any]:
    """A test's row; `main`: the claim's own test (its family shown), not one of its secondary tests. `alpha`: the
    design MDD's level (a primary claim's: alpha / m); `family_ci`: its family-wise interval at `family_level`."""
    mdd, rule = design_mdd(unit, t, alpha, power)
    fam = _ci(family_ci) + (f" ({family_level:.2%})" if family_level and family_ci[0] == family_ci[0] else "")
    return {"id": c.id, "claim": c.statement, "role": role, "family": c.family if main else "—",
            "A": a, "B": b, "unit": unit, "n": t["n"], "runs": t.get("runs", 1),
            "as planned": as_planned(c, t["n"], t.get("runs", 1)) if main else "—",
            "acc A": round(t["acc_a"], 3), "95% CI A": _ci(t["ci_a"]), "acc B": round(t["acc_b"], 3),
            "95% CI B": _ci(t["ci_b"]), "A-B": round(t["difference"], 3), "95% CI A-B": _ci(t["ci_difference"]),
            "family-wise CI A-B": fam, "only A right": t.get("only_a_right"), "only B right": t.get("only_b_right"),
            "test": t["test"], "p": _p(t["p"]), "design MDD": mdd, "MDD rule": rule,
            "majority line": round(t["majority_acc"], 3), "flag": "none", "paper A-B": round(c.effect, 3),
            PAPERS_NUMBER: c.effect_said, "control": "—", "control test": "—", "control n": None, "control A-B": None,
            "control 95% CI": "—", "control p": None, "control status": "—", "baseline": "—", "baseline acc": None,
            "A-baseline": None, "baseline p": None, "precondition": "not measured", "component check": "none",
            "plan": plan_digest, "what it isolates": what}


def majority_arm(truth: dict[str, int], items: Sequence[str]) -> dict[str, bool]:
    """The no-model baseline: the majority label of `items` answered on every one of them."""
    label = collections.Counter(truth[i] for i in items).most_common(1)[0][0] if items else 0
    return {i: truth[i] == label for i in items}


def plan_rows(claims, correct: dict[str, dict[str, bool]], truth: dict[str, int], *, plan_digest: str,
              alpha: float = 0.05, power: float = 0.80, confidence: float = 0.95,
              answers: dict[str, dict[str, Any]] | None = None, first_items: set[str] | None = None,
              preconditions: dict[str, str] | None = None, components: dict[str, str] | None = None,
              arm_names: dict[str, str] | None = None, what: dict[str, str] | None = None,
              extra_baselines: dict[str, dict[str, bool]] | None = None,
              family_sizes: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Each planned claim (lib.evaluation.plan.PlannedClaim) whose arms ran, as rows of COLUMNS: its primary test (the
    plan's unit, on its first n items: `first_items` holds them where a later run grew the claim), then its
    secondary tests, each with the design's MDD. Beside the primary test: its control (the plan's pipeline arm,
    tested against B with the same test on the same items: detected, not detected, or short of the paper's effect),
    its baseline (the no-model arm, "majority" or an arm of `correct` / `extra_baselines`, tested against A with the
    exact McNemar), the near-constant flag (`answers`), the precondition and component check (claim id -> text).
    No answer is substituted and nothing is planted: every number is an arm's. `arm_names`: a plan arm name -> the
    name this table's `correct` gives it. `family_sizes`: family -> its primary claims (m; the plan's
    `family_sizes()`): a primary claim's family-wise interval is at 1 - alpha/m and its design MDD at alpha/m, Holm's
    strictest threshold. Verdicts are not here: they need the family's correction (lib.compendium.findings)."""
    answers, preconditions, components = answers or {}, preconditions or {}, components or {}
    names = arm_names or {}
    extra = extra_baselines or {}
    rows: list[dict[str, Any]] = []
    for c in claims:
        a, b = names.get(c.a, c.a), names.get(c.b, c.b)
        if a not in correct or b not in correct or a == b:
            continue
        common = {i for i in correct[a] if i in correct[b]}
        primary_items = (common & first_items) if (first_items and c.n < len(common)) else common
        t = arm_test(c.unit, a, b, correct, truth, primary_items, confidence, c.runs)
        m = (family_sizes or {}).get(c.family, 1) if c.role == "primary" else 1
        level = family_confidence(alpha, m)
        family_ci = arm_test(c.unit, a, b, correct, truth, primary_items, level, c.runs)["ci_difference"]
        row = _arms_row(c, "primary" if c.role == "primary" else "secondary", a, b, t, c.unit,
                        (what or {}).get(c.id, ""), plan_digest, alpha / m, power, family_ci=family_ci,
                        family_level=level)
        ids = [i for i in sorted(primary_items) if i in correct[a] and i in correct[b]]
        row["flag"] = "; ".join(f for f in (constant_arm(a, answers.get(a), ids), constant_arm(b, answers.get(b), ids))
                                if f) or "none"
        ctl = names.get(c.control, c.control) if c.control else None
        if ctl and ctl in correct:
            unit = c.unit if len(cold_runs_of(ctl, list(correct))) > 1 else "items"
            ct = arm_test(unit, ctl, b, correct, truth, primary_items, confidence, c.runs)
            short = ct["ci_difference"][1] < c.effect
            found = ct["difference"] > 0 and ct["p"] < alpha
            row.update({"control": f"{ctl} vs {b}", "control test": ct["test"], "control n": ct["n"],
                        "control A-B": round(ct["difference"], 3),
                        "control 95% CI": _ci(ct["ci_difference"]), "control p": _p(ct["p"]),
                        "control status": ("detected" if found else "not detected")
                                          + (", short of the paper's effect" if short else "")})
        elif c.control:
            row["control"] = f"{ctl} did not run"
        base = names.get(c.baseline, c.baseline) if c.baseline else None
        if base:
            # an extra baseline named here (even as None: its arm did not run) is the claim's own; never fall back
            # to the arm of the same name in `correct` (another retriever's vote would be measured under its name)
            arm = (majority_arm(truth, ids) if base == "majority" else extra[base] if base in extra
                   else correct.get(base))
            if arm is None:
                row["baseline"] = f"{base} did not run"
            else:
                bt = paired_accuracy_test({i: correct[a][i] for i in ids if i in arm},
                                          {i: arm[i] for i in ids if i in arm}, truth, confidence)
                row.update({"baseline": base, "baseline acc": round(bt["acc_b"], 3),
                            "A-baseline": round(bt["difference"], 3), "baseline p": _p(bt["p"])})
        row["precondition"] = preconditions.get(c.id, "not measured")
        row["component check"] = components.get(c.id, "none")
        rows.append(row)
        for s in c.secondary:
            items = common if s.n is None or s.n >= len(common) else (common & first_items if first_items else common)
            st = arm_test(s.unit, a, b, correct, truth, items, confidence, s.runs)
            sr = _arms_row(c, "secondary", a, b, st, s.unit, s.what, plan_digest, alpha, power, main=False)
            sr["claim"] = f"{c.statement} [{s.what}]"
            rows.append(sr)
    return rows


def table(rows: Sequence[dict[str, Any]]):
    """The rows as a DataFrame in COLUMNS' order (a stage's claims.csv)."""
    import pandas as pd
    return pd.DataFrame(list(rows), columns=list(COLUMNS))
