"""Notebook 05's named cost options, its variant subsets and its claim tests."""
import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from lib.arcade.court import STAGES, Court, CourtConfig, CourtError, Prompts, SampleResult, cap_string_lengths
from lib.arcade.scoring import cost_summary
from lib.arcade.report import claim_frame, court_config, paired_test, post_correct, stage_metrics, variant_posts
from tests.test_debate import CourtScript, Sample, default_answers


def strings(schema):
    """Every string sub-schema of a JSON schema."""
    if isinstance(schema, list):
        for x in schema:
            yield from strings(x)
    elif isinstance(schema, dict):
        if schema.get("type") == "string":
            yield schema
        for v in schema.values():
            yield from strings(v)


@pytest.mark.parametrize("class_mode", ["multiclass", "binary"])
def test_string_max_length_caps_every_free_string_of_every_schema(class_mode):
    plain, capped = Prompts(CourtConfig(class_mode=class_mode)), Prompts(CourtConfig(class_mode=class_mode,
                                                                                        string_max_length=20))
    n_free = 0
    for stage in STAGES:
        before, after = plain.schema(stage), capped.schema(stage)
        for b, a in zip(strings(before), strings(after)):
            if "enum" in b:
                assert a == b                                  # a closed vocabulary is left as it is
            else:
                n_free += 1
                assert a["maxLength"] == min(b.get("maxLength", 20), 20)
                assert {k: v for k, v in a.items() if k != "maxLength"} == {k: v for k, v in b.items()
                                                                          if k != "maxLength"}
    assert n_free > 0
    # without a cap the files are read as written
    assert all(plain.schema(s) == json.loads((plain.schema_dir / f"{name}.json").read_text())
               for s, name in (("rapid_scan", "arcade_rapid_scan"), ("prosecutor", "arcade_prosecutor")))


def test_cap_string_lengths_keeps_a_smaller_limit_and_a_min_length_below_the_cap():
    s = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5},
                                          "b": {"type": "string", "minLength": 30, "maxLength": 90},
                                          "c": {"type": "string"}, "d": {"type": "string", "enum": ["x" * 50]}}}
    out = cap_string_lengths(s, 10)
    p = out["properties"]
    assert p["a"]["maxLength"] == 5 and p["b"] == {"type": "string", "minLength": 10, "maxLength": 10}
    assert p["c"]["maxLength"] == 10 and p["d"] == s["properties"]["d"]
    assert "maxLength" not in s["properties"]["c"]          # the input is not changed


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "48"])
def test_string_max_length_must_be_a_positive_integer(bad):
    with pytest.raises(CourtError, match="string_max_length"):
        CourtConfig(string_max_length=bad)


def test_the_court_sends_the_capped_schema_and_an_answer_over_the_cap_is_not_read():
    cfg = CourtConfig(string_max_length=12, repair_fallback=False)
    long_claim = dict(default_answers()["prosecutor"]["cues"][0], claim="a claim far longer than twelve")
    script = CourtScript(Prompts(cfg), default_answers(prosecutor={"cues": [long_claim]}))
    sent = []
    complete = script.complete

    def spy(messages, params):
        sent.append(params.json_schema)
        return complete(messages, params)
    script.complete = spy
    from lib.models.chat import Chat
    r = Court(Chat(script, None), cfg).run(Sample())
    assert sent and all(x["maxLength"] <= 12 for s in sent for x in strings(s) if "enum" not in x)
    # the same answer fits the uncapped schema and is read; over the cap it is the prosecutor's unreadable answer
    assert [c.status for c in r.calls if c.stage == "prosecutor"] == ["unparseable"]
    plain = CourtConfig(repair_fallback=False)
    script = CourtScript(Prompts(plain), default_answers(prosecutor={"cues": [long_claim]}))
    assert [c.status for c in Court(Chat(script, None), plain).run(Sample()).calls if c.stage == "prosecutor"] == ["ok"]


@dataclass
class Rec:
    id: str
    meta: dict = field(default_factory=dict)


def test_variant_posts_take_the_main_sample_a_smaller_balanced_n_and_named_types():
    from lib.arcade.scoring import balanced_sample
    recs = [Rec(f"p{i}", {"type": t}) for i in range(12) for t in ("000", "001", "100", "110")]
    by_id = {r.id + r.meta["type"]: r for r in recs}
    recs = [Rec(k, r.meta) for k, r in by_id.items()]
    by_id = {r.id: r for r in recs}
    items = [(r.id, r.meta["type"]) for r in recs]
    chosen = [by_id[i] for i in balanced_sample(items, 24, 7)]
    assert variant_posts({}, chosen, by_id, items, 24, 7) == chosen
    small = variant_posts({"samples": 8}, chosen, by_id, items, 24, 7)
    assert len(small) == 8 and {r.id for r in small} <= {r.id for r in chosen}   # the same seed: a subset
    emergent = variant_posts({"types": ["001"]}, chosen, by_id, items, 24, 7)
    assert [r.id for r in emergent] == [r.id for r in chosen if r.meta["type"] == "001"] and len(emergent) == 6
    with pytest.raises(ValueError, match="types"):
        variant_posts({"types": ["011"]}, chosen, by_id, items, 24, 7)


def test_samples_and_types_choose_posts_and_are_not_court_settings():
    section = {"class_mode": "multiclass", "rounds": 3, "temperatures": {}, "max_new_tokens": {},
               "prompt_dir": "params/prompts/arcade", "official_prompts_repo": None, "workers": 2, "seed": 0,
               "variants": {"t2": {"gate": False, "types": ["001"], "samples": 8, "string_max_length": 40,
                                   "prompt_layout": "definition_first"}}}
    cfg = court_config(section, "t2")
    assert cfg.gate is False and cfg.string_max_length == 40 and cfg.prompt_layout == "definition_first"


def result(i, gt, label, status="ok", type_="001", route="track1"):
    return SampleResult(id=str(i), gt=gt, type=type_, difficulty="Hard", route=route, label=label, status=status)


def test_paired_test_counts_discordant_posts_and_gives_the_exact_mcnemar_p():
    truth = {str(i): 1 for i in range(10)}
    a = {str(i): True for i in range(10)}
    b = {str(i): i >= 8 for i in range(10)}                  # A right on 8 posts where B is wrong, never the reverse
    t = paired_test(a, b, truth)
    assert (t["n"], t["only_a_right"], t["only_b_right"]) == (10, 8, 0)
    assert t["mcnemar_exact_p"] == pytest.approx(2 * 0.5 ** 8)
    assert t["ci_a"][1] == 1.0 and 0.6 < t["ci_a"][0] < 0.8 and t["majority_acc"] == 1.0
    same = paired_test(a, a, truth)
    assert same["mcnemar_exact_p"] == 1.0 and same["difference"] == 0


def test_post_correct_counts_a_refused_verdict_wrong_and_reads_binary_mode():
    rs = [result(0, 2, 2), result(1, 2, 3), result(2, 0, 0, status="refused"), result(3, 0, -1)]
    assert post_correct(rs) == {"0": True, "1": False, "2": False, "3": False}
    assert post_correct(rs, "binary") == {"0": True, "1": True, "2": False, "3": False}


def test_claim_frame_pairs_variants_on_the_posts_both_judged_and_feeds_the_metrics():
    arcade = [result(i, 1, 1 if i % 2 else 0, type_="001" if i < 6 else "100") for i in range(12)]
    direct = [result(i, 1, 0, type_="001" if i < 6 else "100") for i in range(12)]
    track2 = [result(i, 1, 1, type_="001") for i in range(6)]
    runs = {k: {"results": v, "cost": cost_summary(v, 2), "corrected": {"n": len(v), "acc": 0.5},
                "official": {"acc": 0.5, "n_refused": 0}}
            for k, v in (("arcade", arcade), ("direct", direct), ("track2_transcript", track2))}
    for k in runs:
        runs[k]["corrected"].update({"acc_easy": 0, "acc_normal": 0, "acc_hard": 0, "acc_normal_hard": 0})
    cf = claim_frame(runs)
    assert "verdict" not in cf.columns                   # verdicts need the family's correction: the findings table's
    primary = cf[cf["role"] == "primary"].set_index("claim")
    row = primary.loc["debate beats a direct judge"]
    assert (row["n"], row["only A right"], row["only B right"]) == (12, 6, 0)
    # one run of each arm where the plan names cold runs: the test says so rather than pass for the planned one
    assert "only 1 run" in row["test"]
    # the direct judge answers 0 on every post: flagged beside the claim, which is still tested
    assert row["flag"] == "direct near-constant (label 0 on 100%)" and row["p"] < 0.05
    assert row["baseline"] == "majority" and row["baseline acc"] == 1.0 and row["A-baseline"] == -0.5
    assert row["control"] == "oracle did not run"
    t2 = primary.loc["Track II's debate reads emergent hate (type 001)"]
    assert t2["n"] == 6 and t2["acc A"] == 1.0 and t2["acc B"] == 0.0
    # the gate's claim: where the gate sent the 6 emergent-hate posts against the 6 others (all to Track I)
    gate = primary.loc["the gate sends emergent hate to the right track"]
    assert gate["n"] == 12 and gate["test"].startswith("Fisher exact") and gate["A-B"] == 0
    # what its routing costs in accuracy stands beside it, on the 6 posts both arms judged, as a description
    cost = cf.set_index("claim").loc["what the gate's routing costs on emergent hate"]
    assert cost["n"] == 6 and cost["role"] == "descriptive"
    assert cf.set_index("claim").loc["the gate saves calls", "role"] == "descriptive"
    assert "Track II with the transcript vs blind debaters" not in set(cf["claim"])     # track2_blind did not run
    assert set(primary["precondition"]) == {"not measured"}
    assert set(cf["plan"]) == {__import__("lib.evaluation.plan", fromlist=["x"]).load().digest}
    # an unmet precondition is a column: every number of the row is the same as without it
    absent = claim_frame(runs, precondition=False)
    judged = absent[(absent["role"] == "primary") & (absent["unit"] != "two shares")]
    assert set(judged["precondition"]) == {"not met"}     # the gate's routing is not the judge's: not measured
    same = [c for c in cf.columns if c != "precondition"]
    assert absent[same].fillna("").equals(cf[same].fillna(""))
    m = stage_metrics(runs, 0.5, 0, cf)
    assert m["claim_arcade_vs_direct_n"] == 12 and m["claim_track2_transcript_vs_direct_acc_a"] == 1.0
    assert m["n_track2_transcript"] == 6


def test_seed_spread_reads_the_repeats_of_a_variant_and_refuses_different_posts():
    from lib.arcade.report import is_seed_repeat, seed_spread
    def run(seed, right, ids=range(4)):
        res = [result(i, 1, 1 if i < right else 0) for i in ids]
        return {"results": res, "config": {"seed": seed}, "corrected": {"acc": right / len(res), "n": len(res)}}
    runs = {"direct": run(0, 1), "direct_seed1": run(1, 2), "direct_seed2": run(2, 4), "arcade": run(0, 3)}
    sp = seed_spread(runs).set_index("variant")
    assert list(sp.index) == ["direct"] and sp.loc["direct", "seeds"] == [0, 1, 2]
    assert sp.loc["direct", "mean"] == pytest.approx(7 / 12) and sp.loc["direct", "min"] == 0.25
    assert sp.loc["direct", "sd"] == pytest.approx(np.std([0.25, 0.5, 1.0], ddof=1))
    assert is_seed_repeat("direct_seed1", runs) and not is_seed_repeat("arcade", runs)
    assert not is_seed_repeat("other_seed1", runs)                  # no variant "other" ran
    m_keys = {k for k in __import__("lib.arcade.report", fromlist=["x"]).stage_metrics(
        {k: {**v, "cost": cost_summary(v["results"], 2), "official": {"acc": 0, "n_refused": 0},
             "corrected": {**v["corrected"], "acc_easy": 0, "acc_normal": 0, "acc_hard": 0, "acc_normal_hard": 0}}
         for k, v in runs.items()}, 0.5, 0, None, sp.reset_index())}
    assert {"direct_seed_mean", "direct_seed_sd", "direct_n_seeds"} <= m_keys
    runs["direct_seed3"] = run(3, 1, ids=range(1, 5))
    with pytest.raises(ValueError, match="different posts"):
        seed_spread(runs)


def test_a_control_stands_only_beside_a_claim_that_ran_and_verdicts_split_by_benign_and_hateful():
    from lib.arcade.report import hate_benign_frame
    oracle = [result(i, i % 3, i % 3, type_="001") for i in range(30)]            # right on every post
    direct = [result(i, i % 3, 0, type_="001") for i in range(30)]                # NotHate on every post
    runs = {k + "_adapted": {"results": v, "cost": cost_summary(v, 2), "corrected": {"n": 30, "acc": 0.5}}
            for k, v in (("oracle", oracle), ("direct", direct), ("arcade", oracle))}
    cf = claim_frame(runs, suffix="_adapted", tag=" (adapted judge)").set_index("claim")
    row = cf.loc["debate beats a direct judge (adapted judge)"]
    # the control is the oracle court's own run against the claim's B arm on the claim's posts, the same test
    assert row["control"] == "oracle_adapted vs direct_adapted" and row["control status"] == "detected"
    assert row["control A-B"] == pytest.approx(20 / 30, abs=1e-3) and row["control p"] < 0.001
    assert not any(c.startswith("control:") for c in cf.index)                # no control row of its own
    # no Track II variant ran on the adapted judge: no Track II claim, and no control standing in for one
    assert not any("Track II" in c for c in cf.index)
    hb = hate_benign_frame({"oracle": runs["oracle_adapted"], "direct": runs["direct_adapted"]})
    assert hb.loc["oracle"].tolist() == [10, 10, 20, 20, 20]
    assert hb.loc["direct"].tolist() == [10, 10, 20, 0, 0]


def test_an_adapted_run_is_drawn_in_its_variants_colour_hatched():
    from lib.arcade.report import bar_styles
    st = bar_styles(["arcade", "direct", "arcade_adapted", "direct_adapted", "oracle_shuffled"])
    assert st[2]["color"] == st[0]["color"] and st[3]["color"] == st[1]["color"] != st[0]["color"]
    assert "hatch" not in st[0] and st[2]["hatch"] != st[4]["hatch"]
    assert st[4]["color"] not in (st[0]["color"], st[1]["color"])          # no oracle bar: a colour of its own


def test_each_controlled_claim_reads_the_oracle_courts_own_run_and_the_gate_has_none():
    """The transcript and settings claims are controlled by the oracle court (debaters that state the true cue) as
    the plan names it, against their B arm, on the claim's posts with the claim's test: the control's numbers are
    the oracle run's answers, none substituted. No run routes by a post's true type, so the gate's claim (the
    share of emergent-hate posts sent to Track II against the other posts', Fisher's exact test) has no control
    and says so."""
    from lib.arcade.report import GATE_CLAIM
    from lib.evaluation.plan import load
    n = 60
    right = [result(i, 1 + i % 3, 1 + i % 3) for i in range(n)]                           # the oracle court
    half = [result(i, 1 + i % 3, 1 + i % 3 if i % 2 else 0) for i in range(n)]           # right on every other post
    weak = [result(i, 1 + i % 3, 1 + i % 3 if i % 2 or i < 4 else 0) for i in range(n)] # 2 posts more than half
    others = [result(100 + i, 1 + i % 3, 1 + i % 3 if i % 2 else 0, type_="110") for i in range(n)]
    runs = {k: {"results": v, "cost": cost_summary(v, 2), "corrected": {"n": n, "acc": 0.5}}
            for k, v in (("oracle", right), ("oracle_type001", weak), ("track2_transcript", half),
                         ("track2_blind", half), ("arcade", half + others), ("arcade_official", half),
                         ("arcade_type001", half), ("direct", half), ("direct_type001", half))}
    plan = load()
    cf = claim_frame(runs, plan=plan)
    cf = cf[cf["role"] == "primary"].set_index("claim")
    for c in plan.of("05_debate", "claims.csv"):
        if c.control and c.statement in cf.index:
            assert cf.loc[c.statement, "control"].startswith(c.control + " vs ")
    blind = cf.loc["Track II with the transcript vs blind debaters"]
    # oracle_type001 is right on 2 posts more than track2_blind: a difference of 2/60, not detected, short of +0.10
    assert blind["control A-B"] == pytest.approx(2 / 60, abs=1e-3) and blind["control p"] == 0.5
    assert blind["control status"] == "not detected, short of the paper's effect"
    gate = cf.loc[GATE_CLAIM[0]]
    # a gate that sends every post to Track I: 0 of 60 emergent-hate posts against 0 of 60 others
    assert gate["n"] == 2 * n and gate["A-B"] == 0 and gate["p"] == 1.0 and gate["control status"] == "none ran"
    assert gate["flag"] == "the gate near-constant (Track I on 100%)"       # flagged as a constant arm is
    # a gate that does send emergent hate to Track II (and nothing else): all 60 against none, Fisher p tiny; a post
    # that Track II's first round dismissed was sent there too
    routed = {**runs, "arcade_type001": {**runs["arcade_type001"], "results": [
        result(i, 1, 1 if i % 4 else 0, route="track2" if i % 4 else "dismissal") for i in range(n)]}}
    row = claim_frame(routed).set_index("claim").loc[GATE_CLAIM[0]]
    assert row["acc A"] == 1.0 and row["acc B"] == 0.0 and row["p"] < 1e-20
    assert row["flag"] == "none"                       # half the posts each way: the gate tells them apart


def test_fisher_power_and_its_rejection_region_follow_scipy():
    """The two-share test's rejection region is Fisher's exact test as scipy computes it, its power grows with
    the difference, and the minimum detectable difference is where it crosses 80%."""
    from scipy.stats import fisher_exact
    from lib.evaluation.claims import _fisher_rejection, fisher_mdd, fisher_power, share_test
    r = _fisher_rejection(12, 9, 0.05)
    for ka, kb in ((0, 0), (6, 0), (12, 3), (2, 9), (7, 4), (12, 0)):
        assert r[ka, kb] == (fisher_exact([[ka, 12 - ka], [kb, 9 - kb]]).pvalue < 0.05), (ka, kb)
    assert fisher_power(96, 84, 0.0, 0.02) < fisher_power(96, 84, 0.0, 0.05) < fisher_power(96, 84, 0.0, 0.10)
    mdd = fisher_mdd(96, 84, 0.0)
    assert fisher_power(96, 84, 0.0, mdd) >= 0.8 > fisher_power(96, 84, 0.0, mdd - 0.005)
    assert fisher_mdd(3, 3, 0.5) != fisher_mdd(3, 3, 0.5)                 # NaN: no rise reaches 80% at 3 and 3
    t = share_test([True] * 10 + [False] * 86, [False] * 84)
    assert t["difference"] == pytest.approx(10 / 96) and t["ci_difference"][0] > 0 and t["p"] < 0.01


def test_claim_frame_takes_a_precondition_per_claim():
    from lib.arcade.report import CLAIMS
    res = {k: [result(i, 1, i % 3 if k == "direct" else (2 if i % 4 else 1), type_="001") for i in range(40)]
           for k in ("arcade", "direct", "track2_transcript")}
    runs = {k: {"results": v, "cost": cost_summary(v, 2), "corrected": {"n": 40, "acc": 0.5}} for k, v in res.items()}
    t2 = "Track II's debate reads emergent hate (type 001)"
    pre = {c: False for c, *_ in CLAIMS} | {t2: None}
    cf = claim_frame(runs, precondition=pre, suffix="", tag="")
    cf = cf[cf["role"] == "primary"].set_index("claim")
    assert cf.loc["debate beats a direct judge", "precondition"] == "not met"
    assert cf.loc[t2, "precondition"] == "not measured"


def test_the_claims_figure_puts_share_rows_on_an_axis_of_their_own(tmp_path):
    """A claims table with a gate's share rows (no majority line) draws them on a second panel labelled as shares;
    without `share_xlabel`, or without such rows, one accuracy panel as before."""
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    from lib.evaluation.figure_kit import claims_figure
    row = {"claim": "debate beats a direct judge", "role": "primary", "unit": "items", "A": "arcade", "B": "direct",
           "n": 96, "runs": 1, "acc A": 0.6, "control A-B": 0.3,
           "95% CI A": "[0.50, 0.70]", "acc B": 0.5, "95% CI B": "[0.40, 0.60]", "test": "exact McNemar", "p": 0.04,
           "majority line": 0.5}
    gate = {**row, "claim": "the gate sends emergent hate to the right track", "A": "arcade_type001", "acc A": 0.1,
            "95% CI A": "[0.05, 0.20]", "acc B": 0.0, "95% CI B": "[0.00, 0.04]", "test": "Fisher exact", "p": 0.002,
            "majority line": None, "runs": None, "unit": "two shares", "control A-B": None}
    path = tmp_path / "claims.csv"
    secondary = {**row, "role": "secondary", "claim": "not drawn"}
    pd.DataFrame([row, {**row, "runs": 3, "claim": "pooled"}, gate, secondary]).to_csv(path, index=False)
    fig = claims_figure(path, "accuracy", "posts", share_xlabel="share sent to Track II")
    acc, shares = fig.axes
    assert (acc.get_xlabel(), shares.get_xlabel()) == ("accuracy", "share sent to Track II")
    assert [t.get_text().split("\n")[0] for t in shares.get_yticklabels()] == [gate["claim"]]
    assert len(acc.get_yticklabels()) == 2 and "x 3 runs" in acc.get_yticklabels()[0].get_text()
    assert not [ln for ln in shares.get_lines() if ln.get_linestyle() == "--"]    # no majority line on a share
    # the control arm is drawn where it ran: B's accuracy plus its difference, on the accuracy panel only
    diamonds = [ln for ln in acc.get_lines() if ln.get_marker() == "D"]
    assert len(diamonds) == 2 and diamonds[0].get_xdata()[0] == pytest.approx(0.8)
    assert not [ln for ln in shares.get_lines() if ln.get_marker() == "D"]
    one = claims_figure(path, "accuracy", "posts")
    assert len(one.axes) == 1 and len(one.axes[0].get_yticklabels()) == 3
