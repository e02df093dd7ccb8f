"""The shared metric helpers: the fast threshold sweep equals the one-call-per-threshold definition."""
import numpy as np
import pytest

from lib.evaluation.metrics import best_threshold, mcnemar, metrics_at, per_type_accuracy, threshold_sweep


def test_threshold_sweep_equals_the_definition():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(14):
        n = int(rng.integers(5, 120))
        y, p = rng.integers(0, 2, n), np.round(rng.random(n), int(rng.integers(1, 4)))     # ties included
        if len(set(y.tolist())) < 2:
            continue
        s = threshold_sweep(p, y)
        at = [metrics_at(p, y, t) for t in s["threshold"]]            # the definition, once per threshold
        for by in ("accuracy", "macro_f1"):
            slow = np.array([m[by] for m in at])
            np.testing.assert_allclose(s[by], slow, atol=1e-12)
            assert best_threshold(p, y, by) == s["threshold"][int(np.argmax(np.round(slow, 12)))]
        checked += 1
    assert checked > 9


def test_per_type_accuracy_counts_and_mcnemar_needs_pairs():
    preds = [{"id": "a", "prediction": 1, "label": 1}, {"id": "b", "prediction": 0, "label": 1},
             {"id": "c", "prediction": 0, "label": 0}]
    assert per_type_accuracy(preds, {"a": "001", "b": "001", "c": "000"}, with_n=True) == {"000": (1.0, 1), "001": (0.5, 2)}
    with pytest.raises(ValueError, match="pair them"):
        mcnemar([True, False], [True])


# ----------------------------------------------------------------------------- notebook 06's statistics
def test_vectorised_statistics_equal_sklearn_on_every_resample_shape():
    from sklearn.metrics import f1_score, roc_auc_score
    from lib.evaluation.metrics import _vec_auroc, _vec_macro_f1
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(4, 60))
        y, p, s = rng.integers(0, 2, n), rng.integers(0, 2, n), np.round(rng.random(n), 1)   # tied scores
        assert _vec_macro_f1(y, p) == pytest.approx(f1_score(y, p, average="macro", zero_division=0))
        if len(set(y.tolist())) == 2:
            assert _vec_auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    # rows are resamples: one row with a single class is nan, the others are defined
    Y = np.array([[1, 1, 1], [0, 1, 1]])
    S = np.array([[0.1, 0.2, 0.3], [0.9, 0.2, 0.3]])
    out = _vec_auroc(Y, S)
    assert np.isnan(out[0]) and out[1] == 0.0


def test_bootstrap_ci_brackets_the_value_narrows_with_n_and_is_reproducible():
    from lib.evaluation.metrics import _vec_accuracy, bootstrap_ci
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 400)
    p = np.where(rng.random(400) < 0.8, y, 1 - y)
    v, lo, hi = bootstrap_ci(_vec_accuracy, y, p, n_resamples=500, seed=3)
    assert lo < v < hi and hi - lo < 0.1
    v2, lo2, hi2 = bootstrap_ci(_vec_accuracy, y[:40], p[:40], n_resamples=500, seed=3)
    assert hi2 - lo2 > 2 * (hi - lo)
    assert bootstrap_ci(_vec_accuracy, y, p, n_resamples=500, seed=3) == (v, lo, hi)
    assert np.isnan(bootstrap_ci(_vec_accuracy, y[:1], p[:1])[1])


def test_metric_rows_count_missing_answers_as_wrong_and_skip_auroc_without_scores():
    import pandas as pd
    from lib.evaluation.metrics import metric_rows
    f = pd.DataFrame({"id": ["a", "b", "c", "d"], "label": [1, 0, 1, 0], "prediction": [1, None, 1, 0]})
    rows = {(r["subset"], r["metric"]): r for r in metric_rows(f, "m", {"all": np.ones(4, bool), "ab": ["a", "b"]},
                                                              n_resamples=200)}
    assert rows[("all", "accuracy")]["value"] == 0.75 and rows[("all", "accuracy")]["n"] == 4
    assert rows[("ab", "accuracy")]["value"] == 0.5 and rows[("ab", "accuracy")]["n"] == 2
    assert ("all", "auroc") not in rows
    with pytest.raises(ValueError, match="masks 2 rows"):
        metric_rows(f, "m", {"bad": np.ones(2, bool)})


def test_pairwise_mcnemar_corrects_for_the_number_of_pairs():
    from lib.evaluation.metrics import pairwise_mcnemar
    rng = np.random.default_rng(4)
    a = rng.random(200) < 0.9
    b = rng.random(200) < 0.5
    c = a.copy()
    c[:3] = ~c[:3]
    df = pairwise_mcnemar({"a": a, "b": b, "c": c}).set_index(["a", "b"])
    assert len(df) == 3
    assert df.loc[("a", "b"), "significant"] and not df.loc[("a", "c"), "significant"]
    assert df.loc[("a", "c"), "test"] == "exact"            # 3 discordant pairs
    assert (df["p_adjusted"] >= df["pvalue"]).all()
    # holm: the smallest p-value is multiplied by the number of pairs
    assert df["p_adjusted"].min() == pytest.approx(min(1.0, 3 * df["pvalue"].min()))
    with pytest.raises(ValueError, match="different numbers"):
        pairwise_mcnemar({"a": a, "b": b[:10]})


def test_flip_rate_counts_only_memes_called_hateful_before():
    from lib.evaluation.metrics import flip_rate
    r = flip_rate([1, 1, 1, 0, 1, None], [0, 1, None, 0, 0, 0], n_resamples=200)
    assert r["n_called_hateful"] == 4                      # the meme called 0 and the unanswered one are out
    assert r["flip_rate"] == 0.5                           # 2 of 4 turned to 0; the unanswered copy is no flip
    assert r["recall_original"] == pytest.approx(4 / 6) and r["recall_injected"] == pytest.approx(1 / 6)
    assert r["n_unanswered_injected"] == 1
    assert r["ci_low"] <= 0.5 <= r["ci_high"]
    with pytest.raises(ValueError, match="pair them"):
        flip_rate([1], [1, 0])


@pytest.mark.parametrize("original, injected, n_benign, reverse", [
    ([1, 1, 1, 0, 1, None], [0, 1, None, 0, 0, 0], 1, 0.0),          # the one non-hateful call stays
    ([0, 0, 0, 0, 1], [1, 1, 0, None, 1], 4, 0.5),                   # 2 of 4 turned hateful; unanswered is no flip
    ([0, 1], [1, 0], 1, 1.0),                                        # both directions at once
    ([1, 1], [0, 0], 0, None),                                       # no non-hateful call: undefined
    ([0, 0, 0], [0, 0, 0], 3, 0.0),
])
def test_flip_rate_reports_the_other_direction_too(original, injected, n_benign, reverse):
    """An injected instruction can also turn a non-hateful call into a hateful one (few-shot recall rose under
    injection): counted among the copies whose original was called non-hateful, with its own interval."""
    from lib.evaluation.metrics import flip_rate
    r = flip_rate(original, injected, n_resamples=200)
    assert r["n_called_not_hateful"] == n_benign
    if reverse is None:
        assert np.isnan(r["reverse_flip_rate"]) and np.isnan(r["reverse_ci_low"])
    else:
        assert r["reverse_flip_rate"] == pytest.approx(reverse)
        assert r["reverse_ci_low"] <= reverse <= r["reverse_ci_high"]


def test_classification_report_matches_sklearn_and_counts_unanswered_as_wrong():
    from sklearn.metrics import f1_score, precision_score, recall_score
    from lib.evaluation.metrics import classification_report, fill_unanswered
    gold = [0, 1, 1, 0, 1, 0, 1, 1]
    pred = [0, 1, None, 1, -1, 0, 1, 0]
    filled = fill_unanswered(gold, pred)
    assert filled == [0, 1, 0, 1, 0, 0, 1, 0]          # None and -1 become the wrong class
    rep = classification_report(gold, pred, labels=[0, 1], positive=1)
    assert rep["accuracy"] == 4 / 8
    assert rep["macro_f1"] == pytest.approx(f1_score(gold, filled, average="macro"))
    assert rep["weighted_f1"] == pytest.approx(f1_score(gold, filled, average="weighted"))
    assert rep["f1_positive"] == pytest.approx(f1_score(gold, filled))
    assert rep["precision_positive"] == pytest.approx(precision_score(gold, filled))
    assert rep["recall_positive"] == pytest.approx(recall_score(gold, filled))
    assert rep["confusion"] == [[2, 1], [3, 2]]
    # multiclass: an unanswered item of class 0 is scored as class 1, of any other class as 0
    assert fill_unanswered([0, 3, 5], [-1, -1, 5]) == [1, 0, 5]
    six = classification_report([0, 3, 5], [-1, -1, 5], labels=range(6))
    assert six["accuracy"] == pytest.approx(1 / 3)
    assert six["macro_f1"] == pytest.approx(f1_score([0, 3, 5], [1, 0, 5], average="macro", labels=list(range(6)),
                                                     zero_division=0))
    assert classification_report([], []) == {}


def test_mean_ci_and_average_precision():
    from lib.evaluation.metrics import average_precision, mean_ci
    assert average_precision([0.1, 0.9, 0.5], [False, True, True]) == 1.0
    assert average_precision([0.9, 0.1], [False, True]) == 0.5
    m, lo, hi, used = mean_ci([1, 2, 3, 4, 5, 6, 7, 8], 500)
    assert m == 4.5 and lo < 4.5 < hi and used == "BCa"
    assert mean_ci([float("nan"), 2.0, 2.0])[:3] == (2.0, 2.0, 2.0)


def test_one_strict_json_reader_for_answers_and_files():
    from lib.compendium.artifacts import loads_strict
    from lib.data.records import DataError
    for bad, why in (('{"a": 1, "a": 2}', "duplicate key 'a'"), ('{"a": NaN}', "field 'a' is NaN, not a finite JSON number"),
                     ('{"a": 1e999}', "field 'a' is 1e999, not a finite"), ("[" * 100_000 + "]" * 100_000, "nested")):
        with pytest.raises(ValueError, match=why):
            loads_strict(bad)
        with pytest.raises(DataError, match=f"data/x.json record 3: .*{why}"):
            loads_strict(bad, "data/x.json record 3", DataError)
    assert loads_strict('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}


def test_proportion_ci_is_honest_at_small_n():
    from lib.evaluation.metrics import proportion_ci
    v, lo, hi = proportion_ci(2, 2)                        # a bootstrap of two memes says [1, 1]
    assert v == 1.0 and hi == 1.0 and lo < 0.5
    v, lo, hi = proportion_ci(0, 5, method="exact")       # Clopper-Pearson: 1 - 0.025 ** (1 / 5)
    assert v == 0.0 and lo == 0.0 and hi == pytest.approx(1 - 0.025 ** 0.2)
    _, lo_w, hi_w = proportion_ci(48, 96)
    assert 0.39 < lo_w < 0.41 and 0.59 < hi_w < 0.61       # n = 96: about +-0.1, the size the samples aim at
    assert all(x != x for x in proportion_ci(0, 0))
    with pytest.raises(ValueError, match="method"):
        proportion_ci(1, 2, method="normal")
    with pytest.raises(ValueError, match="successes"):
        proportion_ci(3, 2)


def test_flip_rate_resamples_memes_not_copies():
    from lib.evaluation.metrics import flip_rate
    orig, inj = [1] * 8, [0, 0, 0, 0, 1, 1, 1, 1]          # meme a's four copies all flip, meme b's none do
    one = flip_rate(orig, inj, n_resamples=500)            # eight independent memes: a narrow Wilson interval
    clustered = flip_rate(orig, inj, n_resamples=500, groups=list("aaaabbbb"))
    assert one["ci"] == "wilson" and clustered["ci"] == "cluster"
    assert one["flip_rate"] == clustered["flip_rate"] == 0.5 and clustered["n_memes_called_hateful"] == 2
    assert clustered["ci_low"] == 0.0 and clustered["ci_high"] == 1.0    # two memes: anything from none to all
    assert one["ci_high"] - one["ci_low"] < 0.7
    tiny = flip_rate([1, 1], [0, 0])
    assert tiny["flip_rate"] == 1.0 and tiny["ci_low"] < 0.5                # never 1.000 [1.000, 1.000] on 2 memes
    with pytest.raises(ValueError, match="groups"):
        flip_rate([1, 1], [0, 0], groups=["a"])


def test_cluster_ratio_ci_counts_each_group_once():
    from lib.evaluation.metrics import cluster_ratio_ci
    v, lo, hi = cluster_ratio_ci([1, 1, 0, 0, 1, 0], [1] * 6, list("aabbcc"), n_resamples=2000, seed=1)
    assert v == 0.5 and 0.0 <= lo <= 0.5 <= hi <= 1.0
    v2, lo2, hi2 = cluster_ratio_ci([1, 1, 0, 0, 1, 0], [1] * 6, list("abcdef"), n_resamples=2000, seed=1)
    assert v2 == v and (hi2 - lo2) <= (hi - lo)            # six independent items are more evidence than three pairs
    assert cluster_ratio_ci([1], [1], ["a"])[1] != cluster_ratio_ci([1], [1], ["a"])[1]   # one group: no interval


def test_metric_rows_wilson_interval_for_accuracy_and_bootstrap_for_the_rest():
    import pandas as pd
    from lib.evaluation.metrics import interval_keys, metric_rows, proportion_ci
    f = pd.DataFrame({"id": list("abcdef"), "label": [1, 0, 1, 0, 1, 0], "prediction": [1, 0, 0, 0, 1, 1],
                      "score": [0.9, 0.1, 0.4, 0.2, 0.8, 0.6]})
    rows = {r["metric"]: r for r in metric_rows(f, "m", {"all": np.ones(6, bool)}, method_ci="wilson", n_resamples=200)}
    assert rows["accuracy"]["ci"] == "wilson" and rows["macro_f1"]["ci"] == "percentile"
    assert (rows["accuracy"]["ci_low"], rows["accuracy"]["ci_high"]) == pytest.approx(proportion_ci(4, 6)[1:])
    k = interval_keys("acc", 4 / 6, 6)
    assert set(k) == {"acc_ci_low", "acc_ci_high"} and k["acc_ci_low"] == rows["accuracy"]["ci_low"]
    assert interval_keys("acc", None, 6) == {} and interval_keys("acc", 0.5, 0) == {}


# ----------------------------------------------------------------------------- power of the paired test
def test_mcnemar_power_equals_a_simulation_of_the_test_itself():
    """The enumerated power against the share of simulated samples that statsmodels' exact McNemar rejects."""
    from lib.evaluation.metrics import mcnemar
    from lib.evaluation.claims import mcnemar_power
    rng = np.random.default_rng(0)
    for n, disc, diff in ((40, 0.3, 0.2), (96, 0.25, 0.1), (60, 0.5, 0.0)):
        sims, rejected = 1500, 0
        p10, p01 = (disc + diff) / 2, (disc - diff) / 2
        for _ in range(sims):
            cell = rng.choice(4, size=n, p=[p10, p01, (1 - disc) / 2, (1 - disc) / 2])   # A only, B only, both, neither
            a, b = np.isin(cell, (0, 2)), np.isin(cell, (1, 2))
            rejected += mcnemar(a, b, exact=True)["pvalue"] < 0.05
        power = mcnemar_power(n, disc, diff)
        se = np.sqrt(max(power * (1 - power), 0.01) / sims)
        assert abs(rejected / sims - power) < 4 * se, (n, disc, diff, rejected / sims, power)
        if diff == 0:
            assert power <= 0.05                                     # the exact test keeps its size


@pytest.mark.parametrize("answers, flagged", [
    ({str(i): 1 for i in range(96)}, "x near-constant (label 1 on 100%)"),           # ARCADE's judge: label 1 on 96 of 96
    ({str(i): 1 if i else 0 for i in range(96)}, "x near-constant (label 1 on 99%)"),
    ({str(i): None for i in range(16)}, "x near-constant (no answer on 100%)"),      # never parses
    ({str(i): 1 if i < 90 else 0 for i in range(96)}, ""),                           # 94%: below the line
    ({str(i): i % 2 for i in range(96)}, ""),
    ({str(i): i % 6 for i in range(96)}, ""),                                        # six categories
])
def test_a_near_constant_arm_is_flagged(answers, flagged):
    from lib.evaluation.claims import constant_arm
    assert constant_arm("x", answers, list(answers)) == flagged
    assert constant_arm("x", None, list(answers)) == "" and constant_arm("x", answers, []) == ""


def test_the_minimum_detectable_difference_at_the_sizes_the_claims_use():
    from lib.evaluation.claims import mcnemar_mdd, mcnemar_power
    mdd = mcnemar_mdd(96, 0.25)
    assert 0.12 < mdd < 0.17 and mcnemar_power(96, 0.25, mdd) == pytest.approx(0.80, abs=0.01)
    assert np.isnan(mcnemar_mdd(24, 0.25)) and np.isnan(mcnemar_mdd(16, 0.25))   # no allowed difference reaches 80%
    assert mcnemar_mdd(768, 0.25) < mcnemar_mdd(192, 0.25) < mdd                   # more items, smaller MDD
    powers = [mcnemar_power(96, 0.3, d) for d in (0.0, 0.05, 0.1, 0.2, 0.3)]
    assert powers == sorted(powers) and powers[-1] > 0.99
    with pytest.raises(ValueError, match="difference"):
        mcnemar_power(96, 0.1, 0.2)


@pytest.mark.parametrize("args, expected", [
    ((0.12, (0.03, 0.21), 0.01, 0.10), "reproduced"),
    ((0.04, (0.02, 0.06), 0.001, 0.10), "reproduced, smaller than the paper"),
    ((-0.05, (-0.08, -0.02), 0.001, 0.10), "contradicted"),               # significant against the paper
    ((0.00, (-0.05, 0.05), 1.0, 0.10), "not reproduced"),                 # the family-wise interval excludes 0.10
    ((0.02, (-0.10, 0.14), 0.7, 0.10), "inconclusive"),
    ((0.05, (-0.01, 0.12), 0.09, 0.10), "inconclusive"),
    ((0.05, (0.01, 0.09), 0.2, 0.10), "not reproduced"),                  # raw p small, adjusted not: no reproduction
    ((0.05, (0.01, 0.09), float("nan"), 0.10), "not reproduced"),
])
def test_the_verdict_follows_its_written_rules(args, expected):
    from lib.evaluation.verdicts import VERDICTS, verdict
    v = verdict(*args)
    assert v == expected and v in VERDICTS


def test_nothing_but_the_test_decides_a_verdict(tmp_path, monkeypatch, plan_at):
    """Every column beside the test (control, baseline, precondition, component check, flag) rewritten in a committed
    claims table: the findings table's verdicts stay as they were; a change of the test's own p moves them."""
    import pandas as pd
    from lib.arcade.report import claim_frame
    from lib.compendium import findings
    from tests.test_debate_oracle import _runs
    plan_at(96)                                                   # the synthetic runs' sizes, as the plan's
    (tmp_path / "05_debate").mkdir()
    f = tmp_path / "05_debate" / "claims.csv"
    t = claim_frame(_runs({"arcade": 0.90, "direct": 0.40, "oracle": 0.95, "track2_transcript": 0.6,
                           "direct_type001": 0.5, "oracle_type001": 0.9}))
    t.to_csv(f, index=False)
    monkeypatch.setattr(findings, "results_dir", lambda profile: tmp_path)
    before = {r["id"]: r["verdict"] for r in findings.findings_rows("embedded")}
    assert before["arcade.debate_vs_direct"] == "reproduced"
    beside = t.assign(**{"control status": "not detected, short of the paper's effect", "control p": 1.0,
                         "control A-B": -0.5, "precondition": "not met", "component check": "capacity check",
                         "flag": "arcade near-constant (label 0 on 100%)", "baseline acc": 1.0, "A-baseline": -0.9,
                         "baseline p": 1e-9})
    beside.to_csv(f, index=False)
    assert {r["id"]: r["verdict"] for r in findings.findings_rows("embedded")} == before
    t.assign(p=1.0).to_csv(f, index=False)                                  # the test itself: the verdict moves
    assert {r["id"]: r["verdict"] for r in findings.findings_rows("embedded")}["arcade.debate_vs_direct"] != "reproduced"


def test_holm_controls_the_family_and_keeps_order():
    from lib.evaluation.verdicts import holm
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.2]) == [0.2] and holm([]) == []
    adj = holm([0.001, float("nan"), 0.5])
    assert adj[0] == pytest.approx(0.002) and np.isnan(adj[1]) and adj[2] == pytest.approx(0.5)


def test_the_seed_level_test_and_its_power():
    from lib.evaluation.verdicts import seed_t_mdd, seed_t_power, seed_t_test
    t = seed_t_test([0.05, 0.06, 0.04, 0.07, 0.05])
    assert t["seeds"] == 5 and t["p"] < 0.001 and t["ci_difference"][0] < 0.054 < t["ci_difference"][1]
    assert np.isnan(seed_t_test([0.05])["p"])
    mdd = seed_t_mdd(5, 0.02)
    assert seed_t_power(5, 0.02, mdd) == pytest.approx(0.80, abs=0.01) and seed_t_mdd(10, 0.02) < mdd


def test_the_design_mdd_is_not_the_observed_discordance_alone():
    """Arms that agree by chance on most items (low observed discordance) at accuracies whose independent errors would
    disagree often: the design is powered at the larger discordance."""
    from lib.evaluation.claims import design_mdd, mcnemar_mdd
    from lib.evaluation.verdicts import design_discordance
    assert design_discordance(0.5, 0.5, 0.05) == pytest.approx(0.5)
    t = {"n": 96, "acc_a": 0.5, "acc_b": 0.5, "only_a_right": 2, "only_b_right": 3, "test": "exact McNemar", "runs": 1}
    mdd, rule = design_mdd("items", t)
    assert mdd == round(mcnemar_mdd(96, 0.5), 3) and "discordance 0.50" in rule
    assert np.isnan(mcnemar_mdd(96, 5 / 96))              # the observed discordance alone: "none at this n"


def test_a_claims_row_carries_its_control_and_baseline_as_arms_of_the_pipeline():
    """plan_rows: the claim's primary test on its first n items, its secondary tests, its control (a pipeline arm
    tested against B: no answer substituted) and baseline (against A); no verdict in a stage's table."""
    from lib.evaluation.claims import plan_rows
    from lib.evaluation.plan import PlannedClaim, Secondary
    items = [str(i) for i in range(200)]
    truth = {i: int(k % 2) for k, i in enumerate(items)}
    a = {i: k % 4 != 0 for k, i in enumerate(items)}                  # 0.75
    b = {i: k % 2 == 0 for k, i in enumerate(items)}                  # 0.50
    oracle = {i: True for i in items}
    c = PlannedClaim("x.claim", "X", "a beats b", "04_few_shot", "claims.csv", "a", "b", "items", 1, 96, "memes",
                     "exact McNemar", None, None, "primary", "findings", "oracle", "majority",
                     (Secondary("items", 1, "the grown set", 200),))
    rows = plan_rows([c], {"a": a, "b": b, "oracle": oracle}, truth, plan_digest="d", first_items=set(items[:96]))
    primary, second = rows
    assert primary["n"] == 96 and second["n"] == 200 and second["role"] == "secondary" and primary["role"] == "primary"
    assert "verdict" not in primary and primary["plan"] == "d"
    assert primary["control"] == "oracle vs b" and primary["control A-B"] == 0.5 and primary["control status"] == "detected"
    assert primary["baseline"] == "majority" and primary["baseline acc"] == 0.5 and primary["A-baseline"] == 0.25
    assert primary["paper A-B"] == 0.10 and primary["design MDD"] > 0


def test_a_control_that_cannot_reach_the_effect_says_so():
    from lib.evaluation.claims import plan_rows
    from lib.evaluation.plan import PlannedClaim
    items = [str(i) for i in range(96)]
    truth = {i: 0 for i in items}
    base = {i: k < 48 for k, i in enumerate(items)}
    weak = {i: k < 50 for k, i in enumerate(items)}                   # +0.02 on every item: not detected, short
    c = PlannedClaim("x.c", "X", "a beats b", "05_debate", "claims.csv", "a", "b", "items", 1, 96, "posts",
                     "exact McNemar", None, None, "primary", "findings", "oracle", None)
    assert plan_rows([c], {"b": base, "oracle": weak}, truth, plan_digest="d") == []   # arm a did not run: no row
    row = plan_rows([c], {"a": weak, "b": base, "oracle": weak}, truth, plan_digest="d")[0]
    assert row["control status"] == "not detected, short of the paper's effect"


def test_the_findings_table_reads_the_family_wise_interval_a_claims_table_writes(tmp_path, monkeypatch, plan_at):
    """A claim whose family-wise interval lies wholly below the paper's effect, with nothing significant, reads
    "not reproduced" from the claims table's own columns (its interval written with its level beside it)."""
    import pandas as pd
    from lib.arcade.report import claim_frame
    from lib.compendium import findings
    from tests.test_debate_oracle import _runs
    plan_at(96)
    (tmp_path / "05_debate").mkdir()
    t = claim_frame(_runs({"arcade": 0.40, "direct": 0.40, "oracle": 0.95}))
    row = t[(t["id"] == "arcade.debate_vs_direct") & (t["role"] == "primary")].iloc[0]
    assert row["family-wise CI A-B"].endswith("(99.81%)") or "%" in row["family-wise CI A-B"]
    t.to_csv(tmp_path / "05_debate" / "claims.csv", index=False)
    monkeypatch.setattr(findings, "results_dir", lambda profile: tmp_path)
    got = {r["id"]: r for r in findings.findings_rows("embedded")}["arcade.debate_vs_direct"]
    assert got["family ci"] != "—" and got["verdict"] == "not reproduced"      # A = B on every post: [0, 0]
    assert findings._interval("[-0.132, 0.012] (99.81%)") == (-0.132, 0.012)
    assert findings._interval("—") != findings._interval("—")                  # NaNs: no interval
