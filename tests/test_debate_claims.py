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
    cf = claim_frame(runs).set_index("claim")
    assert cf.loc["debate beats a direct judge", "n"] == 12
    assert cf.loc["debate beats a direct judge", "only A right"] == 6
    # the direct judge answers 0 on every post: flagged, not read as a moderator (arcade varies: not flagged)
    assert cf.loc["debate beats a direct judge", "flag"] == "direct near-constant (label 0 on 100%)"
    row = cf.loc["Track II's debate reads emergent hate (type 001)"]
    assert row["n"] == 6 and row["acc A"] == 1.0 and row["acc B"] == 0.0
    # the gate's claim counts where the gate sent the 6 emergent-hate posts and the 6 others (all to Track I);
    # what its routing costs in accuracy is a row beside it, on the 6 posts both arms judged, with no verdict
    assert cf.loc["the gate sends emergent hate to the right track", "n"] == 12
    assert cf.loc["what the gate's routing costs on emergent hate", "n"] == 6
    assert cf.loc["what the gate's routing costs on emergent hate", "verdict"] == "—"
    assert "the gate saves calls" in cf.index
    assert "Track II with the transcript vs blind debaters" not in cf.index     # track2_blind did not run
    assert set(cf["precondition"].dropna()) == {"not measured"}
    # a judge that fails its precondition (it cannot tell the categories even from oracle debaters): every
    # claim it decides reads 'mechanism absent' unless flagged near-constant first
    absent = claim_frame(runs, precondition=False).set_index("claim")
    assert absent.loc["Track II's debate reads emergent hate (type 001)", "precondition"] == "not met"
    assert absent.loc["debate beats a direct judge", "verdict"] == "near-constant arm"
    varied = {k: {**v, "results": [result(i, 1, i % 3 if k == "direct" else (2 if i % 4 else 1), type_="001")
                                   for i in range(40)]} for k, v in runs.items()}
    t2 = "Track II's debate reads emergent hate (type 001)"
    row = claim_frame(varied, precondition=False).set_index("claim").loc[t2]
    assert row["flag"] == "none" and row["verdict"] == "mechanism absent in MemeWorld"
    assert claim_frame(varied).set_index("claim").loc[t2, "verdict"] == "no test"      # no control, nothing measured
    assert claim_frame(runs, precondition=True).set_index("claim").loc[
        "Track II's debate reads emergent hate (type 001)", "precondition"] == "met"
    m = stage_metrics(runs, 0.5, 0, claim_frame(runs))
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


def test_a_control_row_stands_only_beside_a_claim_that_ran_and_verdicts_split_by_benign_and_hateful():
    from lib.arcade.report import hate_benign_frame
    oracle = [result(i, i % 3, i % 3, type_="001") for i in range(30)]            # right on every post
    direct = [result(i, i % 3, 0, type_="001") for i in range(30)]                # NotHate on every post
    runs = {k + "_adapted": {"results": v, "cost": cost_summary(v, 2), "corrected": {"n": 30, "acc": 0.5}}
            for k, v in (("oracle", oracle), ("direct", direct), ("arcade", oracle))}
    cf = claim_frame(runs, suffix="_adapted", tag=" (adapted judge)")
    claims = set(cf["claim"])
    assert "debate beats a direct judge (adapted judge)" in claims
    assert "control: debate beats a direct judge (adapted judge)" in claims
    # no Track II variant ran on the adapted judge: its control (which would fall back to the main posts) is left out
    assert not any("Track II" in c for c in claims)
    hb = hate_benign_frame({"oracle": runs["oracle_adapted"], "direct": runs["direct_adapted"]})
    assert hb.loc["oracle"].tolist() == [10, 10, 20, 20, 20]
    assert hb.loc["direct"].tolist() == [10, 10, 20, 0, 0]


def test_an_adapted_run_is_drawn_in_its_variants_colour_hatched():
    from lib.arcade.report import bar_styles
    st = bar_styles(["arcade", "direct", "arcade_adapted", "direct_adapted", "oracle_shuffled"])
    assert st[2]["color"] == st[0]["color"] and st[3]["color"] == st[1]["color"] != st[0]["color"]
    assert "hatch" not in st[0] and st[2]["hatch"] != st[4]["hatch"]
    assert st[4]["color"] not in (st[0]["color"], st[1]["color"])          # no oracle bar: a colour of its own


def test_every_claim_has_a_positive_control_the_gates_from_a_gate_that_routes_right():
    """The transcript and settings claims are controlled by the oracle court (debaters that state the true cue)
    against their B arm, the same test at the same n; the gate's claim (the share of emergent-hate posts sent
    to Track II against the other posts' share, Fisher's exact test) by a gate that sends emergent hate to
    Track II, put in on the fewest posts that reach the paper's effect."""
    from lib.arcade.report import CLAIMS, CONTROLS, GATE_CLAIM
    assert {c for c, *_ in CONTROLS} == {c for c, *_ in CLAIMS} and GATE_CLAIM[0] not in {c for c, *_ in CLAIMS}
    n = 60
    right = [result(i, 1 + i % 3, 1 + i % 3) for i in range(n)]                           # the oracle court
    half = [result(i, 1 + i % 3, 1 + i % 3 if i % 2 else 0) for i in range(n)]           # right on every other post
    others = [result(100 + i, 1 + i % 3, 1 + i % 3 if i % 2 else 0, type_="110") for i in range(n)]
    runs = {k: {"results": v, "cost": cost_summary(v, 2), "corrected": {"n": n, "acc": 0.5}}
            for k, v in (("oracle", right), ("oracle_type001", right), ("track2_transcript", half),
                         ("track2_blind", half), ("arcade", half + others), ("arcade_official", half),
                         ("arcade_type001", half), ("direct", half), ("direct_type001", half))}
    cf = claim_frame(runs).set_index("claim")
    for claim in ("Track II with the transcript vs blind debaters", "the compendium's settings vs the official code's"):
        ctl = cf.loc["control: " + claim]
        assert ctl["n"] == n and ctl["A-B"] >= 0.1 and ctl["p"] < 0.05, ctl    # the paper's effect, detected
    gate, ctl = cf.loc[GATE_CLAIM[0]], cf.loc["control: " + GATE_CLAIM[0]]
    # a gate that sends every post to Track I: 0 of 60 emergent-hate posts against 0 of 60 others
    assert gate["n"] == 2 * n and gate["A-B"] == 0 and gate["p"] == 1.0 and gate["control"] == "detected"
    assert gate["verdict"] == "not reproduced"               # the control was seen; the interval excludes +0.10
    # its control: the right route on the fewest posts that reach +0.10 (6 of 60), detected by the same test
    assert ctl["n"] == 2 * n and 0.1 <= ctl["A-B"] < 0.1 + 1 / n and ctl["p"] < 0.05 and ctl["verdict"] == "control detected"
    assert "6 of 60" in ctl["what it isolates"]
    # a gate that does send emergent hate to Track II (and nothing else) reproduces the claim; a post that Track
    # II's first round dismissed was sent there too
    routed = {**runs, "arcade_type001": {**runs["arcade_type001"], "results": [
        result(i, 1, 1 if i % 4 else 0, route="track2" if i % 4 else "dismissal") for i in range(n)]}}
    row = claim_frame(routed).set_index("claim").loc[GATE_CLAIM[0]]
    assert row["acc A"] == 1.0 and row["verdict"] == "reproduced"


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
    cf = claim_frame(runs, precondition=pre, suffix="", tag="").set_index("claim")
    assert cf.loc["debate beats a direct judge", "precondition"] == "not met"
    assert cf.loc[t2, "precondition"] == "not measured" and cf.loc[t2, "verdict"] == "no test"


def test_the_claims_figure_puts_share_rows_on_an_axis_of_their_own(tmp_path):
    """A claims table with a gate's share rows (no majority line) draws them on a second panel labelled as shares;
    without `share_xlabel`, or without such rows, one accuracy panel as before."""
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    from lib.evaluation.figure_kit import claims_figure
    row = {"claim": "debate beats a direct judge", "A": "arcade", "B": "direct", "n": 96, "runs": 1, "acc A": 0.6,
           "95% CI A": "[0.50, 0.70]", "acc B": 0.5, "95% CI B": "[0.40, 0.60]", "test": "exact McNemar", "p": 0.04,
           "majority line": 0.5}
    gate = {**row, "claim": "the gate sends emergent hate to the right track", "A": "arcade_type001", "acc A": 0.1,
            "95% CI A": "[0.05, 0.20]", "acc B": 0.0, "95% CI B": "[0.00, 0.04]", "test": "Fisher exact", "p": 0.002,
            "majority line": None, "runs": None}
    path = tmp_path / "claims.csv"
    pd.DataFrame([row, {**row, "runs": 3, "claim": "pooled"}, gate]).to_csv(path, index=False)
    fig = claims_figure(path, "accuracy", "posts", share_xlabel="share sent to Track II")
    acc, shares = fig.axes
    assert (acc.get_xlabel(), shares.get_xlabel()) == ("accuracy", "share sent to Track II")
    assert [t.get_text().split("\n")[0] for t in shares.get_yticklabels()] == [gate["claim"]]
    assert len(acc.get_yticklabels()) == 2 and "x 3 runs" in acc.get_yticklabels()[0].get_text()
    assert not [ln for ln in shares.get_lines() if ln.get_linestyle() == "--"]    # no majority line on a share
    one = claims_figure(path, "accuracy", "posts")
    assert len(one.axes) == 1 and len(one.axes[0].get_yticklabels()) == 3
