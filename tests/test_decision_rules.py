"""The verdict rules proven by simulation, through the production code: synthetic paired outcomes with a known truth
(no effect, the paper's effect in either direction) at the compendium's sizes (n 96, 480, 998 items; discordance
0.1 to 0.5; single-run and 5-seed designs), 2,000 synthetic tables per condition, decided by the functions the
findings table uses: the exact McNemar p (`metrics.exact_mcnemar_p`) and Newcombe's paired interval
(`metrics.paired_difference_ci`) that `metrics.paired_accuracy_test` returns, the seed-level t test
(`verdicts.seed_t_test`), the design's MDD (`claims.design_mdd`), and the family's Holm correction and verdicts
(`verdicts.decide`). A first test checks that `claims.plan_rows` (the claims tables) gives exactly these numbers
for a sample of tables, so the simulation's fast path is the production path.

Asserted, with binomial (Wilson) intervals: under no effect, a family of 26 claims (the plan's mix of single-run
and 5-seed designs) gets any *reproduced* or *contradicted* at most 5% of the time (the upper end of the interval);
with the paper's effect everywhere, any *not reproduced* or *contradicted* at most 5%; a single claim under no
effect is read either way at most about 5% (the interval reaches 5%); the power a design states at its MDD (at
Holm's strictest threshold, alpha / 26) is the simulated rate within 5 points. Not simulated: the sign-flip test of
cold runs, CLIP4DM's bootstrap and the gate's Fisher test (each family member's validity is what Holm needs; these
three are checked in their own tests). The rates are written to artifacts/test-logs/decision_rules.json and
printed; the generator's seed is fixed per test, never chosen for the rates."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lib.compendium.artifacts import ARTIFACTS_ROOT, write_json
from lib.evaluation import claims, metrics
from lib.evaluation import plan as analysis
from lib.evaluation.plan import PlannedClaim
from lib.evaluation.verdicts import decide, family_confidence, seed_t_mdd, seed_t_test

TABLES = 2000
EFFECT = 0.10                      # the paper's effect where it publishes none (the plan's default)
ALPHA = 0.05
M = analysis.load().family_sizes()["findings"]     # the plan's primary claims (26 in version 2)
LEVEL = family_confidence(ALPHA, M)
BASE_ACC = 0.6                     # B's accuracy on the items both arms agree on
RATES: dict[str, dict] = {}


def _rng(name: str) -> np.random.Generator:
    """One generator per test, seeded from its name: a test's rates do not depend on which others ran."""
    return np.random.default_rng([20261205, sum(map(ord, name))])


def _wilson(k: int, n: int) -> tuple[float, float]:
    return tuple(float(x) for x in metrics.proportion_ci(k, n)[1:])


def tables(n: int, discordance: float, difference: float, size: int, rng) -> tuple[np.ndarray, ...]:
    """`size` paired tables of `n` items as (both right, only A, only B, neither): m ~ Bin(n, discordance) discordant
    items split b | m ~ Bin(m, (discordance + difference) / (2 discordance)), the rest right for both with BASE_ACC."""
    m = rng.binomial(n, discordance, size)
    b = rng.binomial(m, (discordance + difference) / (2 * discordance))
    both = rng.binomial(n - m, BASE_ACC)
    return both, b, m - b, n - m - both


def single_tests(n: int, disc: float, truth: float, rng, size: int = TABLES) -> list[dict]:
    """Each synthetic table as the findings table reads a claims row: p, difference, family-wise interval."""
    a, b, c, d = tables(n, disc, truth, size, rng)
    p = metrics.exact_mcnemar_p(b, c)
    lo, hi = metrics.paired_difference_ci(a, b, c, d, LEVEL)
    return [{"p": float(p[k]), "difference": float((b[k] - c[k]) / n), "family_ci": (float(lo[k]), float(hi[k])),
             "effect": EFFECT} for k in range(size)]


SEED_SD = 0.012                    # the spread of a per-seed accuracy difference (TRACE's, 998 memes: about 0.01)


def seed_tests(truth: float, rng, sd: float = SEED_SD, seeds: int = 5, size: int = TABLES) -> list[dict]:
    out = []
    for row in rng.normal(truth, sd, (size, seeds)):
        t = seed_t_test(row, LEVEL)
        out.append({"p": t["p"], "difference": t["difference"], "family_ci": t["ci_difference"], "effect": EFFECT})
    return out


def test_the_simulation_reads_the_numbers_the_claims_tables_write():
    """plan_rows on synthetic arms: its p, interval, family-wise interval and design MDD are the functions the
    simulation calls, table for table (single runs and seeds)."""
    rng = _rng("equivalence")
    plan_claim = PlannedClaim("x.c", "X", "a beats b", "04_few_shot", "claims.csv", "a", "b", "items", 1, 96, "memes",
                              "exact McNemar", None, None, "primary", "findings", None, None)
    for k in range(20):
        both, b, c, d = (int(x[0]) for x in tables(96, 0.3, 0.05 * (k % 3 - 1), 1, rng))
        cells = [(True, True)] * both + [(True, False)] * b + [(False, True)] * c + [(False, False)] * d
        correct = {"a": {str(i): x for i, (x, _) in enumerate(cells)}, "b": {str(i): y for i, (_, y) in enumerate(cells)}}
        row = claims.plan_rows([plan_claim], correct, {str(i): 0 for i in range(96)}, plan_digest="d",
                               family_sizes={"findings": M})[0]
        lo, hi = metrics.paired_difference_ci(both, b, c, d, 0.95)
        flo, fhi = metrics.paired_difference_ci(both, b, c, d, LEVEL)
        assert row["p"] == float(f"{float(metrics.exact_mcnemar_p(b, c)):.3g}")
        assert row["95% CI A-B"] == f"[{float(lo):.3f}, {float(hi):.3f}]"
        assert row["family-wise CI A-B"].startswith(f"[{float(flo):.3f}, {float(fhi):.3f}]")
        t = metrics.paired_accuracy_test(correct["a"], correct["b"], {str(i): 0 for i in range(96)})
        want = claims.design_mdd("items", t, ALPHA / M)[0]
        assert row["design MDD"] == want if want == want else row["design MDD"] != row["design MDD"]
    seeds = PlannedClaim("x.s", "X", "a beats b", "02_finetuning", "claims.csv", "a", "b", "seeds", 5, 96, "memes",
                         "paired t over seeds", None, None, "primary", "findings", None, None)
    correct = {}
    for s in range(5):
        sfx = "" if s == 0 else f"_run{s}"
        correct["a" + sfx] = {str(i): bool(rng.random() < 0.65) for i in range(96)}
        correct["b" + sfx] = {str(i): bool(rng.random() < 0.60) for i in range(96)}
    row = claims.plan_rows([seeds], correct, {str(i): 0 for i in range(96)}, plan_digest="d",
                           family_sizes={"findings": M})[0]
    diffs = [np.mean(list(correct["a" + x].values())) - np.mean(list(correct["b" + x].values()))
             for x in ["", "_run1", "_run2", "_run3", "_run4"]]
    t = seed_t_test(diffs, LEVEL)
    assert row["test"] == "paired t over 5 seeds" and row["p"] == float(f"{t['p']:.3g}")
    assert row["family-wise CI A-B"].startswith(f"[{t['ci_difference'][0]:.3f}, {t['ci_difference'][1]:.3f}]")


CONDITIONS = [(n, disc) for n in (96, 480, 998) for disc in (0.1, 0.3, 0.5)]


@pytest.mark.parametrize("n, disc", CONDITIONS)
def test_one_claim_is_rarely_read_either_way_without_an_effect_and_never_against_the_papers(n, disc):
    """A single-run claim alone (its family of one, so its own alpha): under no effect, reproduced or contradicted
    about 5% of the time at most (the interval reaches 0.05); under the paper's effect in either direction, read the
    other way at most 1% of the time."""
    rng = _rng(f"single {n} {disc}")
    for truth, wrong in ((0.0, ("reproduced", "contradicted", "reproduced, smaller than the paper")),
                         (EFFECT, ("contradicted",)), (-EFFECT, ("reproduced", "reproduced, smaller than the paper"))):
        if abs(truth) > disc:
            continue
        v = [decide([t], ALPHA)[0]["verdict"] for t in single_tests(n, disc, truth, rng)]
        k = sum(x in wrong for x in v)
        RATES.setdefault(f"single n={n} discordance={disc}", {})[f"truth {truth:+.2f}: read wrong"] = k / TABLES
        lo, hi = _wilson(k, TABLES)
        assert lo <= 0.05 and k / TABLES <= 0.055 if truth == 0 else hi <= 0.01, (n, disc, truth, k / TABLES)


#: the plan's family (version 2): 3 claims on 5 seeds, the rest single runs at its sizes
FAMILY = [("seeds", None, None)] * 3 + [("single", 96, 0.3)] * 17 + [("single", 180, 0.2)] * 2 + \
         [("single", 998, 0.3)] * 4


def _families(truth: float, rng) -> list[list[dict]]:
    per_claim = [seed_tests(truth, rng) if kind == "seeds" else single_tests(n, disc, truth, rng)
                 for kind, n, disc in FAMILY]
    return [[claim[k] for claim in per_claim] for k in range(TABLES)]


def test_a_family_under_no_effect_is_read_as_reproduced_or_contradicted_at_most_5_percent_of_the_time():
    """All 26 claims with no effect, corrected together by Holm: any reproduced or contradicted in the family at most
    5% of the time (the interval's upper end); uncorrected, far more often (shown beside)."""
    assert len(FAMILY) == M and sum(kind == "seeds" for kind, _, _ in FAMILY) == sum(
        c.unit == "seeds" for c in analysis.load().claims if c.role == "primary" and c.family == "findings")
    fams = _families(0.0, _rng("family none"))
    wrong = sum(any(d["verdict"] not in ("inconclusive", "not reproduced") for d in decide(f, ALPHA)) for f in fams)
    raw = sum(any(t["p"] < ALPHA for t in f) for f in fams)
    RATES["family of 26, no effect"] = {"any reproduced or contradicted (Holm)": wrong / TABLES,
                                        "any p < 0.05 uncorrected": raw / TABLES}
    assert _wilson(wrong, TABLES)[1] <= 0.05, wrong / TABLES
    assert raw / TABLES > 0.3                     # why the correction is there


def test_a_family_with_the_papers_effect_is_read_as_not_reproduced_or_contradicted_at_most_5_percent_of_the_time():
    """All 26 claims with exactly the paper's effect: the family-wise intervals keep any false "not reproduced" (and
    any "contradicted") in the family at most 5% of the time; 95% intervals alone would not (shown beside)."""
    fams = _families(EFFECT, _rng("family paper"))
    wrong = sum(any(d["verdict"] in ("not reproduced", "contradicted") for d in decide(f, ALPHA)) for f in fams)
    RATES["family of 26, the paper's effect"] = {"any not reproduced or contradicted": wrong / TABLES}
    assert _wilson(wrong, TABLES)[1] <= 0.05, wrong / TABLES


@pytest.mark.parametrize("n, disc", CONDITIONS)
def test_the_power_a_single_run_design_states_at_its_mdd_is_the_simulated_rate(n, disc):
    """design_mdd's McNemar MDD at Holm's strictest threshold (alpha / 26), for a table whose observed discordance is
    the design's: the simulated share of p below that threshold at that difference is 80% within 5 points."""
    rng = _rng(f"power {n} {disc}")
    # accuracies of 0.95: independent errors would disagree on 0.095 of the items, so the observed discordance decides
    probe = {"n": n, "acc_a": 0.95, "acc_b": 0.95, "only_a_right": round(n * disc / 2),
             "only_b_right": round(n * disc / 2), "test": "exact McNemar"}
    design = claims.design_discordance(0.95, 0.95, round(n * disc / 2) * 2 / n)
    mdd, rule = claims.design_mdd("items", probe, ALPHA / M)
    if mdd != mdd:        # the design says no difference reaches 80% power: not even the largest one possible, where
        # every discordant item goes A's way, does in the simulation
        _, b, c, _ = tables(n, design, design, TABLES, rng)
        rate = float(np.mean(metrics.exact_mcnemar_p(b, c) < ALPHA / M))
        RATES.setdefault(f"single n={n} discordance={disc}", {}).update({"design discordance": design, "mdd": None,
                                                                          "power at the largest difference": rate})
        assert rate < 0.80, (n, disc, rule, rate)
        return
    _, b, c, _ = tables(n, design, mdd, TABLES, rng)
    rate = float(np.mean(metrics.exact_mcnemar_p(b, c) < ALPHA / M))
    RATES.setdefault(f"single n={n} discordance={disc}", {}).update({"design discordance": design, "mdd": mdd,
                                                                      "power at mdd": rate})
    assert abs(rate - 0.80) <= 0.05, (n, disc, mdd, rate)


@pytest.mark.parametrize("sd", [0.006, 0.012, 0.03])
def test_the_power_a_5_seed_design_states_at_its_mdd_is_the_simulated_rate(sd):
    rng = _rng(f"seeds {sd}")
    mdd = seed_t_mdd(5, sd, 0.80, ALPHA / M)
    rate = float(np.mean([seed_t_test(row)["p"] < ALPHA / M for row in rng.normal(mdd, sd, (TABLES, 5))]))
    RATES[f"5 seeds, sd={sd}"] = {"mdd": round(mdd, 4), "power at mdd": rate}
    assert abs(rate - 0.80) <= 0.05, (sd, mdd, rate)
    v = [decide([t], ALPHA)[0]["verdict"] for t in seed_tests(0.0, rng, sd)]
    k = sum(x not in ("inconclusive", "not reproduced") for x in v)
    RATES[f"5 seeds, sd={sd}"]["no effect: reproduced or contradicted"] = k / TABLES
    # the t test is exact: its rate is 0.05 up to sampling (2,000 tables: a standard error of 0.005)
    assert _wilson(k, TABLES)[0] <= 0.05 and k / TABLES <= 0.06


def test_seeds_that_agree_exactly_give_no_test():
    """A zero spread over seeds is no evidence: no p, no interval (a p of 0 would read as reproduced)."""
    t = seed_t_test([0.02] * 5)
    assert t["p"] != t["p"] and t["ci_difference"][0] != t["ci_difference"][0]
    assert decide([{"p": t["p"], "difference": 0.02, "family_ci": t["ci_difference"], "effect": EFFECT}])[0][
        "verdict"] == "inconclusive"


def test_newcombes_interval_covers_the_truth_at_its_level():
    """The paired interval the McNemar claims print: at n = 96 and 998, its 95% interval covers the true difference
    at least 94% of the time, and its family-wise one (1 - 0.05/26, nominal 99.8%) at least 99.5% (2,000 tables)."""
    rng = _rng("coverage")
    for n, disc, truth in ((96, 0.3, 0.05), (998, 0.3, -0.02), (96, 0.1, 0.0)):
        a, b, c, d = tables(n, disc, truth, TABLES, rng)
        for level, floor in ((0.95, 0.94), (LEVEL, 0.995)):
            lo, hi = metrics.paired_difference_ci(a, b, c, d, level)
            cover = float(np.mean((lo <= truth) & (truth <= hi)))
            RATES.setdefault("Newcombe coverage", {})[f"n={n} disc={disc} truth={truth} level={level:.4f}"] = cover
            assert cover >= floor, (n, disc, truth, level, cover)


def test_zz_the_rates_are_reported():
    """Written where make test's logs are (artifacts/test-logs/decision_rules.json) and printed."""
    assert RATES
    write_json(ARTIFACTS_ROOT / "test-logs" / "decision_rules.json", {"tables_per_condition": TABLES, "rates": RATES})
    print(json.dumps(RATES, indent=1))
