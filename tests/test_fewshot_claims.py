"""Notebook 04's sizing and claims: the type-balanced evaluation draw and its nested subset, settings
that run on the subset, the structured answer with capped strings, and the paired claim tests."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
from scipy.stats import binomtest

from lib.sei import fewshot as sei, report as rep
from lib.models.chat.structured import cap_string_lengths
from lib.sei.fewshot import Meme, Prediction

TYPES = ["000", "001", "010", "011", "100", "101", "110", "111"]


def _memes(per_type=(30, 20, 15, 40, 12, 25, 18, 22)):
    out, k = [], 0
    for t, n in zip(TYPES, per_type):
        for _ in range(n):
            out.append(Meme(str(k), Path("x"), "", int(t[-1] == "1"), split="test", type=t))
            k += 1
    return out


def test_type_balanced_draw_is_equal_per_type_seeded_and_in_input_order():
    memes = _memes()
    sub = sei.balanced_subset(memes, 96, seed=3, by="type")
    assert len(sub) == 96
    assert {t: sum(m.type == t for m in sub) for t in TYPES} == {t: 12 for t in TYPES}
    assert [m.id for m in sub] == [m.id for m in sei.balanced_subset(memes, 96, seed=3, by="type")]
    assert [m.id for m in sub] != [m.id for m in sei.balanced_subset(memes, 96, seed=4, by="type")]
    order = [int(m.id) for m in sub]
    assert order == sorted(order)                                 # the input order is kept
    odd = sei.balanced_subset(memes, 20, seed=0, by="type")       # 20 = 8 x 2 + 4: the first four types get 3
    assert [sum(m.type == t for m in odd) for t in TYPES] == [3, 3, 3, 3, 2, 2, 2, 2]


def test_type_draw_is_nested_and_fills_a_short_type_from_the_others():
    memes = _memes()
    big = {m.id for m in sei.balanced_subset(memes, 96, seed=1, by="type")}
    small = {m.id for m in sei.balanced_subset(memes, 24, seed=1, by="type")}
    assert small < big                                            # a smaller n is a subset of a larger one
    short = sei.balanced_subset(memes, 120, seed=0, by="type")    # type 100 has 12 memes, quota 15
    counts = {t: sum(m.type == t for m in short) for t in TYPES}
    assert len(short) == 120 and counts["100"] == 12 and sum(counts.values()) == 120
    with pytest.raises(ValueError, match="interaction type"):
        sei.balanced_subset([Meme("a", Path("x"), "", 1), Meme("b", Path("x"), "", 0)], 1, by="type")
    with pytest.raises(ValueError, match="balance must be"):
        sei.balanced_subset(memes, 10, by="difficulty")


def test_settings_take_the_answer_format_and_a_named_subset():
    ctrl = {"zero_shot": {"n": 0}, "free": {"n": 4, "retriever": "default", "structured": False}}
    s = {x.name: x for x in sei.parse_settings(ctrl, ["enc"], [2, 4], "structured", {"n": 8, "settings": ["enc/2", "free"]})}
    assert s["enc/4"].structured and s["zero_shot"].structured and not s["free"].structured
    assert (s["enc/2"].eval_n, s["free"].eval_n, s["enc/4"].eval_n, s["zero_shot"].eval_n) == (8, 8, 0, 0)
    assert not any(x.structured for x in sei.parse_settings(ctrl, ["enc"], [4]) if x.name != "free")
    with pytest.raises(ValueError, match="names no setting"):
        sei.parse_settings(ctrl, ["enc"], [4], subset={"n": 8, "settings": ["enc/2"]})
    with pytest.raises(ValueError, match="answer_format"):
        sei.parse_settings(ctrl, ["enc"], [4], "json")
    with pytest.raises(ValueError, match="expected keys"):
        sei.parse_settings(ctrl, ["enc"], [4], subset={"settings": ["enc/4"]})


def test_subset_settings_plan_only_their_memes_and_nest_in_the_evaluation_set():
    import numpy as np
    memes = _memes()
    pool = [Meme(f"p{i}", Path("x"), "", i % 2, split="train") for i in range(40)]
    queries = sei.balanced_subset(memes, 48, seed=0, by="type")
    ranked = {"enc": np.tile(np.arange(8), (len(queries), 1))}
    settings = sei.parse_settings({"random_4": {"n": 4, "exemplars": "random"}}, ["enc"], [2, 4], "structured",
                                  {"n": 16, "settings": ["enc/2"]})
    plans, runs_on = rep.plan_settings(settings, queries, pool, ranked, "most_similar_last", 0, 0, "type")
    assert len(runs_on["enc/4"]) == 48 and len(runs_on["enc/2"]) == 16
    assert {m.id for m in runs_on["enc/2"]} < {m.id for m in queries}
    assert [sum(m.type == t for m in runs_on["enc/2"]) for t in TYPES] == [2] * 8
    assert set(plans["enc/2"]) == {m.id for m in runs_on["enc/2"]} and set(plans["enc/4"]) == {m.id for m in queries}
    full = sei.plan_exemplars(settings[0], queries, pool, ranked, "most_similar_last", 0)
    assert all(plans["enc/2"][i] == full[i] for i in plans["enc/2"])   # the same exemplars as over all queries


def test_cold_runs_of_a_grown_setting_keep_the_size_the_others_run_on():
    """A setting grown for its claim's power (eval_n memes, the rest on a nested subset) can keep its cold runs
    at the others' size (`cold_runs.n`), nested in its own draw; without `n` a cold run runs where its setting does."""
    import numpy as np
    ctrl = {"random_4": {"n": 4, "exemplars": "random"}, "zero_shot": {"n": 0}}
    grown = sei.parse_settings(ctrl, ["enc"], [2, 4], "structured", {"n": 16, "settings": ["enc/2", "zero_shot"]},
                               {"runs": 3, "settings": ["main", "random_4"], "n": 16})
    s = {x.name: x for x in grown}
    assert (s["enc/4"].eval_n, s["random_4"].eval_n, s["enc/2"].eval_n) == (0, 0, 16)
    assert [s[f"{c}_run{r}"].eval_n for c in ("enc/4", "random_4") for r in (1, 2)] == [16] * 4
    assert s["enc/4_run2"].replicate == 2 and s["enc/4_run2"].n == 4
    plain = {x.name: x for x in sei.parse_settings(ctrl, ["enc"], [4], "structured", {"n": 16, "settings": ["enc/4"]},
                                                    {"runs": 2, "settings": ["main", "random_4"]})}
    assert (plain["enc/4_run1"].eval_n, plain["random_4_run1"].eval_n) == (16, 0)
    small = {x.name: x for x in sei.parse_settings(ctrl, ["enc"], [4], "structured", {"n": 8, "settings": ["enc/4"]},
                                                    {"runs": 2, "settings": ["main"], "n": 16})}
    assert small["enc/4_run1"].eval_n == 8                                 # never more memes than its setting
    memes = _memes()
    pool = [Meme(f"p{i}", Path("x"), "", i % 2, split="train") for i in range(40)]
    queries = sei.balanced_subset(memes, 48, seed=0, by="type")
    ranked = {"enc": np.tile(np.arange(8), (len(queries), 1))}
    _, runs_on = rep.plan_settings(grown, queries, pool, ranked, "most_similar_last", 0, 0, "type")
    assert len(runs_on["enc/4"]) == 48 and len(runs_on["enc/4_run1"]) == 16
    assert [m.id for m in runs_on["enc/4_run1"]] == [m.id for m in runs_on["enc/2"]]   # the same nested memes
    for bad in ({"runs": 2, "settings": ["main"], "n": 0}, {"runs": 2, "settings": ["main"], "n": True},
                {"runs": 2, "settings": ["main"], "size": 4}):
        with pytest.raises(ValueError, match="cold_runs"):
            sei.parse_settings(ctrl, ["enc"], [4], cold_runs=bad)


def test_a_grown_evaluation_sets_subset_is_the_smaller_runs_draw():
    """eval_n grown from 48 to 96 with the other settings on a 48-meme subset: drawn from the test split, the
    subset is the 48-meme run's own evaluation set (their answers are shared); drawn from the 96 it is not.
    A draw that does not lie inside the evaluation set (a type runs short) falls back to the evaluation set."""
    import numpy as np
    memes = _memes()                                                   # the smallest type has 12 memes
    small, grown = sei.balanced_subset(memes, 48, 0, "type"), sei.balanced_subset(memes, 96, 0, "type")
    assert {m.id for m in small} < {m.id for m in grown}
    pool = [Meme(f"p{i}", Path("x"), "", i % 2, split="train") for i in range(40)]
    ranked = {"enc": np.tile(np.arange(8), (len(grown), 1))}
    settings = sei.parse_settings({"zero_shot": {"n": 0}}, ["enc"], [4], "structured", {"n": 48, "settings": ["zero_shot"]})
    plans, runs_on = rep.plan_settings(settings, grown, pool, ranked, "most_similar_last", 0, 0, "type", population=memes)
    assert [m.id for m in runs_on["zero_shot"]] == [m.id for m in small] and len(runs_on["enc/4"]) == 96
    assert set(plans["zero_shot"]) == {m.id for m in small}
    from_grown = sei.setting_queries(settings[1], grown, 0, "type")
    assert len(from_grown) == 48 and {m.id for m in from_grown} != {m.id for m in small}
    eight = replace(settings[1], eval_n=8)
    outside = sei.balanced_subset(memes, 8, 1, "type")
    assert not {m.id for m in outside} <= {m.id for m in small}
    got = sei.setting_queries(eight, small, 1, "type", population=memes)            # the split's draw is not inside
    assert [m.id for m in got] == [m.id for m in sei.balanced_subset(small, 8, 1, "type")]


def test_structured_answer_schema_caps_its_strings_and_keeps_the_label_enum():
    plain, capped = sei.answer_schema(), sei.answer_schema(120)
    assert plain["properties"]["explanation"]["maxLength"] == 300
    assert capped["properties"]["explanation"]["maxLength"] == 120
    assert capped["properties"]["intervention"]["maxLength"] == 120
    assert capped["properties"]["label"] == plain["properties"]["label"]
    assert cap_string_lengths({"type": "string", "maxLength": 50}, 120)["maxLength"] == 50
    a = sei.parse_answer(json.dumps({"label": "non-hateful", "explanation": "e", "intervention": "i"}),
                         parsed={"label": "non-hateful", "explanation": "e", "intervention": "i"})
    assert (a.status, a.label, a.intervention, a.dropped_intervention) == ("ok", 0, "", True)


def _pred(i, gold, label, setting, status="ok"):
    return Prediction(str(i), gold, setting, status, label, "", "", False, False, [], [])


def test_claim_frame_pairs_settings_on_shared_memes_with_the_exact_test():
    gold = [i % 2 for i in range(40)]
    main = [_pred(i, g, g if i < 30 else 1 - g, "memeworld-clip/4") for i, g in enumerate(gold)]   # 30 right
    rnd = [_pred(i, g, g if i < 18 else 1 - g, "random_4") for i, g in enumerate(gold)]           # 18 right
    zero = [_pred(i, g, None, "zero_shot", "unparseable") for i, g in enumerate(gold)]            # unreadable = wrong
    sub = [_pred(i, g, 1 - g, "memeworld-clip/2") for i, g in enumerate(gold) if i < 10]           # 10 memes, all wrong
    c = rep.claim_frame({"memeworld-clip/4": main, "random_4": rnd, "zero_shot": zero, "memeworld-clip/2": sub},
                        "memeworld-clip/4", "memeworld-clip")
    assert "verdict" not in c.columns
    r = c[c["role"] == "primary"].set_index("B")
    assert list(r.index) == ["random_4", "zero_shot", "memeworld-clip/2"]          # the plan's claims whose arms ran
    assert (r.loc["random_4", "n"], r.loc["random_4", "only A right"], r.loc["random_4", "only B right"]) == (40, 12, 0)
    assert r.loc["random_4", "p"] == pytest.approx(float(f"{binomtest(0, 12, 0.5).pvalue:.3g}"))
    # the plan decides this claim over cold runs; with one run of each arm the row says it fell back to one
    assert r.loc["random_4", "test"].startswith("exact McNemar (only 1 run") and r.loc["random_4", "runs"] == 1
    assert r.loc["zero_shot", "test"] == "exact McNemar"
    assert (r.loc["zero_shot", "acc B"], r.loc["zero_shot", "only A right"]) == (0.0, 30)
    assert (r.loc["memeworld-clip/2", "n"], r.loc["memeworld-clip/2", "acc A"],
            r.loc["memeworld-clip/2", "majority line"]) == (10, 1.0, 0.5)
    # each row states its power from the design: the exact test's MDD at its n and the larger of the observed
    # discordance and the one independent errors at these accuracies would give (0.75 x 0.55 + 0.25 x 0.45 = 0.525)
    # at Holm's strictest threshold, alpha / m (m: the plan's primary claims)
    from lib.evaluation.claims import mcnemar_mdd
    from lib.evaluation.plan import load
    level = 0.05 / load().family_sizes()["findings"]
    assert r.loc["zero_shot", "design MDD"] == round(mcnemar_mdd(40, 30 / 40, 0.8, level), 3)
    assert r.loc["random_4", "design MDD"] == round(mcnemar_mdd(40, 0.525, 0.8, level), 3)
    assert "independent errors" in r.loc["random_4", "MDD rule"]
    assert r.loc["memeworld-clip/2", "design MDD"] != r.loc["memeworld-clip/2", "design MDD"] or \
        r.loc["memeworld-clip/2", "design MDD"] > 0.5               # 10 memes: none, or only a huge difference
    m = rep.claim_metrics(c)
    assert m["claim_memeworld-clip_4_vs_random_4_n"] == 40 and m["claim_memeworld-clip_4_vs_memeworld-clip_2_n"] == 10
    assert m["claim_memeworld-clip_4_vs_zero_shot_acc_b"] == 0.0


def test_knn_predictions_are_the_exemplars_majority():
    import numpy as np
    pool = [Meme(f"p{i}", Path("x"), "", int(i < 3)) for i in range(6)]
    qs = [Meme("a", Path("x"), "", 1), Meme("b", Path("x"), "", 1)]
    preds = rep.knn_predictions(np.array([[0, 1, 2], [3, 4, 0]]), pool, qs)
    assert [p.label for p in preds] == [1, 0]
    assert rep.prediction_correct(preds) == {"a": True, "b": False}


def test_same_type_exemplars_are_the_nearest_of_the_querys_type():
    """The oracle retriever (`exemplars: same_type`, the retrieval claims' positive control) reads the whole
    ranking: the query's own interaction type first, nearest first, then the nearest others."""
    import numpy as np
    from pathlib import Path
    from lib.sei import fewshot as sei
    from lib.sei.fewshot import Meme
    pool = [Meme(str(i), Path("x"), "", int(t != "000"), type=t) for i, t in
            enumerate(["000", "001", "000", "011", "001", "000"])]
    queries = [Meme("q", Path("x"), "", 1, type="001"), Meme("r", Path("x"), "", 1, type="110")]
    ranked = {"enc": np.array([[0, 2, 1, 3, 4, 5], [5, 4, 3, 2, 1, 0]])}
    plan = sei.plan_exemplars(sei.Setting("same_type_2", 3, "enc", "same_type"), queries, pool, ranked, "most_similar_first")
    assert [j for j, _ in plan["q"]] == [1, 4, 0]                 # both type-001 memes, then the nearest other
    assert [j for j, _ in plan["r"]] == [5, 4, 3]                 # no meme of its type: the plain ranking
    assert [lab for _, lab in plan["q"]] == [1, 1, 0]             # gold labels shown
    with pytest.raises(ValueError, match="interaction type"):
        sei.plan_exemplars(sei.Setting("s", 1, "enc", "same_type"), [Meme("x", Path("x"), "", 1)], pool,
                           {"enc": ranked["enc"][:1]}, "most_similar_first")


def test_the_same_type_setting_is_each_claims_control_on_the_claims_own_memes():
    """The control is the same-type exemplars' setting (a full arm of the same prompting pipeline) against the claim's
    B arm on the claim's memes with the claim's test; a moderator that ignores its exemplars leaves it undetected,
    and the text retriever's claim reads the control on its own memes, not on another claim's."""
    gold = [i % 2 for i in range(96)]
    main = [_pred(i, g, g if i < 50 else 1 - g, "memeworld-clip/4") for i, g in enumerate(gold)]
    rnd = [_pred(i, g, g if i < 48 else 1 - g, "random_4") for i, g in enumerate(gold)]
    oracle = [_pred(i, g, g if i < 90 else 1 - g, "same_type_4") for i, g in enumerate(gold)]
    c = rep.claim_frame({"memeworld-clip/4": main, "random_4": rnd, "same_type_4": oracle}, "memeworld-clip/4",
                        "memeworld-clip")
    row = c[(c["id"] == "sei.retrieved_vs_random") & (c["role"] == "primary")].iloc[0]
    assert row["control"] == "same_type_4 vs random_4" and row["control status"] == "detected"
    assert row["control A-B"] == pytest.approx(42 / 96, abs=1e-3)                # the arm's own answers: 90 vs 48
    assert not c["claim"].str.startswith("control:").any()
    weak = [_pred(i, g, g if i < 48 else 1 - g, "same_type_4") for i, g in enumerate(gold)]   # it ignores them
    c2 = rep.claim_frame({"memeworld-clip/4": main, "random_4": rnd, "same_type_4": weak}, "memeworld-clip/4",
                         "memeworld-clip")
    row2 = c2[(c2["id"] == "sei.retrieved_vs_random") & (c2["role"] == "primary")].iloc[0]
    assert row2["control status"] == "not detected, short of the paper's effect"
    # the claim's own numbers do not move with its control
    keep = ["A-B", "p", "95% CI A-B", "design MDD"]
    assert row2[keep].tolist() == row[keep].tolist()
    # the text retriever's claim on its 40 memes: its control is tested on those 40, where same_type_4 and
    # random_4 are both right on every meme (on all 96 the control's difference is 42/96)
    text = [_pred(i, g, g, "memeworld-clip+text/4") for i, g in enumerate(gold) if i < 40]
    c3 = rep.claim_frame({"memeworld-clip/4": main, "random_4": rnd, "same_type_4": oracle,
                          "memeworld-clip+text/4": text}, "memeworld-clip/4", "memeworld-clip",
                         preconditions={"memeworld-clip": False, "memeworld-clip+text": True})
    t = c3[c3["id"] == "sei.text_retriever"].iloc[0]
    assert t["n"] == 40 and t["control A-B"] == 0 and t["control status"].startswith("not detected")
    assert t["precondition"] == "met"
    first = c3[(c3["id"] == "sei.retrieved_vs_random") & (c3["role"] == "primary")].iloc[0]
    assert first["precondition"] == "not met" and first["p"] == row["p"]          # a column, never a verdict


def test_a_control_is_held_to_its_own_papers_effect_and_the_adapted_table_is_tagged():
    """A claim with a published effect (four exemplars beat two: 0.0214) holds its control's "short" to that
    effect, not to 0.10; the adapted moderator's table carries the plan's adapted claims, tagged."""
    gold = [i % 2 for i in range(96)]
    arms = {"memeworld-clip/4": 50, "random_4": 48, "zero_shot": 48, "shuffled_labels_4": 47, "labels_only_4": 49,
            "knn_vote": 46, "memeworld-clip/2": 50, "same_type_4": 53}    # how many of the 96 each arm gets right
    preds = {s: [_pred(i, g, g if i < k else 1 - g, s) for i, g in enumerate(gold)] for s, k in arms.items()}
    c = rep.claim_frame(preds, "memeworld-clip/4", "memeworld-clip")
    c = c[c["role"] == "primary"].set_index("id")
    two = c.loc["sei.four_vs_two"]
    assert (two["B"], two["paper A-B"]) == ("memeworld-clip/2", 0.021)
    # the same-type arm is 3 memes above enc/2: not detected, and its interval does reach 0.021
    assert two["control A-B"] == pytest.approx(3 / 96, abs=1e-3) and two["control status"] == "not detected"
    # held to 0.10: +5/96 reaches it (interval [0.001, 0.102], p 0.0625), +4/96 does not ([-0.005, 0.088])
    assert c.loc["sei.zero_shot", "control status"] == "not detected"
    assert c.loc["sei.explanations", "control status"] == "not detected, short of the paper's effect"   # +4/96
    tagged = rep.claim_frame(preds, "memeworld-clip/4", "memeworld-clip", tag=rep.ADAPTED_MODERATOR_TAG)
    assert len(tagged) and all(n.split(" [")[0].endswith(" (adapted moderator)") for n in tagged["claim"])
    assert set(tagged["id"]) <= {c.id for c in __import__("lib.evaluation.plan", fromlist=["x"]).load().of(
        "04_few_shot", "claims_adapted.csv")}


def test_a_labels_only_setting_shows_each_exemplar_with_its_label_alone():
    """The "Explain" ingredient removed (SEI with labels only): the same exemplars and labels, their answers
    without explanation or intervention; every other turn as in the full prompt."""
    from pathlib import Path
    from lib.sei import fewshot as sei
    from lib.sei.fewshot import Meme
    tpl = sei.SeiTemplates.load()
    shots = [Meme("a", Path("x"), "text a", 1, caption="a cap", explanation="it mocks them", intervention="say why"),
             Meme("b", Path("x"), "text b", 0, caption="b cap", explanation="a plain joke")]
    q = Meme("q", Path("x"), "text q", None, caption="q cap")
    full = sei.build_conversation(q, shots, tpl, images=False)
    bare = sei.build_conversation(q, shots, tpl, images=False, labels_only=True)
    assert [m["role"] for m in bare] == [m["role"] for m in full]
    assert [bare[2]["content"], bare[4]["content"]] == [sei.LABELS[1], sei.LABELS[0]] or \
        [bare[2]["content"][0]["text"], bare[4]["content"][0]["text"]] == [sei.LABELS[1], sei.LABELS[0]]
    assert "it mocks them" in str(full[2]) and "it mocks them" not in str(bare)
    assert [m for k, m in enumerate(bare) if k not in (2, 4)] == [m for k, m in enumerate(full) if k not in (2, 4)]
    s = sei.parse_settings({"labels_only_4": {"n": 4, "retriever": "default", "labels_only": True}}, ["enc"], [4])
    assert [x.labels_only for x in s] == [False, True]
    with pytest.raises(ValueError, match="unknown keys"):
        sei.parse_settings({"x": {"n": 4, "labels": True}}, ["enc"], [4])


def test_a_retriever_without_exemplars_has_no_knn_baseline_rather_than_the_main_retrievers():
    """The text retriever's claim is held against its own exemplars' kNN vote. When that retriever's exemplars
    are missing, the row says its baseline did not run; it never measures the main retriever's vote under the
    name knn_vote."""
    gold = [i % 2 for i in range(96)]
    main = [_pred(i, g, g, "memeworld-clip/4") for i, g in enumerate(gold)]
    text = [_pred(i, g, g, "memeworld-clip+text/4") for i, g in enumerate(gold)]
    rnd = [_pred(i, g, g if i < 48 else 1 - g, "random_4") for i, g in enumerate(gold)]
    vote = [_pred(i, g, 1 - g, "knn_vote") for i, g in enumerate(gold)]          # the main retriever's vote
    preds = {"memeworld-clip/4": main, "memeworld-clip+text/4": text, "random_4": rnd, "knn_vote": vote}
    without = rep.claim_frame(preds, "memeworld-clip/4", "memeworld-clip")
    without = without[without["role"] == "primary"].set_index("id")
    assert without.loc["sei.text_retriever", "baseline"] == "knn_vote did not run"
    assert str(without.loc["sei.text_retriever"].get("A-baseline", "")) in ("", "nan")
    own = [_pred(i, g, g if i < 60 else 1 - g, "knn_vote") for i, g in enumerate(gold)]
    withk = rep.claim_frame(preds, "memeworld-clip/4", "memeworld-clip",
                            knn={"memeworld-clip+text": own})
    withk = withk[withk["role"] == "primary"].set_index("id")
    assert withk.loc["sei.text_retriever", "baseline"] == "knn_vote"
    assert withk.loc["sei.text_retriever", "baseline acc"] == pytest.approx(60 / 96, abs=1e-3)
