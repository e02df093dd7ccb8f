"""Notebook 06's plumbing: every system's artifacts read into one shape, the common memes enforced,
and the long table's subsets and CIs."""
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from lib.compendium import artifacts
from lib.evaluation import crosseval as ce


@pytest.fixture
def fake_artifacts(memeworld_small, tmp_path, monkeypatch):
    """A profile whose 00 holds a small MemeWorld and whose 02 / 04 / 05 hold hand-written predictions."""
    monkeypatch.setattr(artifacts, "ARTIFACTS_ROOT", tmp_path)
    root, _ = memeworld_small
    mw = tmp_path / "p" / "00_data_prep" / "memeworld"
    mw.mkdir(parents=True)
    shutil.copy(root / "memeworld.jsonl", mw / "memeworld.jsonl")
    rows = [json.loads(x) for x in (root / "memeworld.jsonl").read_text().splitlines()]
    test = [r for r in rows if r["split"].startswith("test")]
    run = tmp_path / "p" / "02_finetuning" / "runs" / "fhm_enc_cls_rel"
    run.mkdir(parents=True)
    (run / "result.json").write_text("{}")
    pd.DataFrame([{"id": str(r["id"]), "split": r["split"], "probability": 0.9 if r["final_label"] else 0.1,
                   "threshold": 0.5, "prediction": r["final_label"], "label": r["final_label"], "selected": "text",
                   "selected_weight": 1.0} for r in test]).to_csv(run / "predictions.csv", index=False)
    rep = run.parent / "fhm_enc_cls_rel_seed1"              # a seed replicate: read through seeds.csv, not a method
    shutil.copytree(run, rep)
    few = tmp_path / "p" / "04_few_shot"
    few.mkdir(parents=True)
    few_rows = [{"id": str(r["id"]), "gold": r["final_label"], "setting": "enc/4",
                 "label": None if k == 0 else 1 - r["final_label"]} for k, r in enumerate(test[:6])]
    (few / "predictions_fhm.jsonl").write_text("".join(json.dumps(x) + "\n" for x in few_rows))
    deb = tmp_path / "p" / "05_debate"
    deb.mkdir(parents=True)
    deb_rows = [{"id": str(r["id"]), "gt": r["final_category"], "label": r["final_category"] if k % 2 else -1,
                 "route": "track1"} for k, r in enumerate(test[:6])]
    for v in ("arcade", "rerun_check"):
        (deb / f"results_{v}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in deb_rows))
    return test


def test_artifacts_read_into_one_shape(fake_artifacts):
    test = fake_artifacts
    gold = ce.gold_table("p")
    assert len(gold) == len(test) and set(gold.columns) >= {"split", "label", "type", "difficulty", "confounder"}
    tr = ce.trace_methods("p")
    assert list(tr) == ["TRACE enc_cls_rel"] and (tr["TRACE enc_cls_rel"]["frame"]["prediction"] ==
                                                   tr["TRACE enc_cls_rel"]["frame"]["label"]).all()
    fs = ce.fewshot_methods("p")["few-shot enc/4"]["frame"]
    assert fs["prediction"].isna().sum() == 1 and (fs["prediction"].dropna() != fs["label"][1:]).all()
    db = ce.debate_methods("p")
    assert list(db) == ["debate arcade"]                       # the rerun check is not a method
    f = db["debate arcade"]["frame"]
    assert f["prediction"].isna().sum() == 3                   # label -1: no usable verdict
    assert ((f["label"] == 1) == [r["final_category"] > 0 for r in test[:6]]).all()


def test_long_table_enforces_the_common_memes_and_counts_no_answer_as_wrong(fake_artifacts):
    gold = ce.gold_table("p")
    methods = {**ce.trace_methods("p"), **ce.fewshot_methods("p")}
    common = list(methods["few-shot enc/4"]["frame"]["id"])
    t = ce.long_table(methods, gold, common, n_resamples=200)
    acc = t[(t.metric == "accuracy") & (t.subset == "all")].set_index("method")["value"]
    assert acc["TRACE enc_cls_rel"] == 1.0 and acc["few-shot enc/4"] == 0.0
    assert set(t[t.method == "few-shot enc/4"].metric) == {"accuracy", "macro_f1"}      # no score, no AUROC
    assert (t.groupby(["method", "subset"]).n.first().xs("all", level=1) == len(common)).all()
    types = {s for s in t.subset if s.startswith("type ")}
    assert types and sum(t[(t.method == "TRACE enc_cls_rel") & t.subset.isin(types) & (t.metric == "accuracy")].n) == 6
    with pytest.raises(ValueError, match="no prediction for"):
        ce.long_table(methods, gold, list(gold.index[:50]), n_resamples=100)
    cm = ce.correct_matrix(methods, common)
    assert cm.shape == (6, 2) and cm["TRACE enc_cls_rel"].all() and not cm["few-shot enc/4"].any()


def test_headline_and_figures_draw_from_the_table(fake_artifacts):
    import matplotlib
    matplotlib.use("Agg")
    gold = ce.gold_table("p")
    methods = {**ce.trace_methods("p"), **ce.fewshot_methods("p")}
    common = list(methods["few-shot enc/4"]["frame"]["id"])
    t = pd.concat([ce.long_table(methods, gold, common, n_resamples=100),
                   ce.long_table(methods, gold, None, "own", n_resamples=100)])
    h = ce.headline(t[t.memes == "common"])
    assert list(h.index.get_level_values("method")) == list(methods)
    for fig in (ce.plot_forest(t, chance=0.5), ce.plot_type_heatmap(t)):
        assert fig.axes


def test_hvli_samples_map_to_fhm_memes_by_image_name(tmp_path):
    from types import SimpleNamespace as R
    fhm = [R(id="42953", img_path=tmp_path / "img" / "42953.png"), R(id="17", img_path=tmp_path / "img" / "00017.png")]
    hv = [R(id="h1", img_path=tmp_path / "imgs" / "FHM" / "42953.png"), R(id="h2", img_path=tmp_path / "imgs" / "MMHS" / "9.jpg"),
          R(id="h3", img_path=tmp_path / "imgs" / "FHM" / "00017.png")]
    m = ce.hvli_to_fhm(hv, fhm)
    assert m == {"h1": "42953", "h3": "17"}
    meth = {"frame": ce._frame([{"id": "h1", "label": 1, "prediction": 1, "score": np.nan},
                                {"id": "h2", "label": 0, "prediction": 1, "score": np.nan}])}
    assert list(ce.rekey(meth, m)["frame"]["id"]) == ["42953"]


def test_flip_rows_split_instruction_and_control_copies():
    kind = {"a": "instruction", "b": "instruction", "c": "control"}
    rows = ce.FlipRows(kind, n_resamples=200, seed=0)
    rows.add("m", "fewshot", [1, 1, 1], [0, 1, 1], ["a", "b", "c"])
    f = rows.frame().set_index("copies")
    assert f.loc["instruction", "flip_rate"] == 0.5 and f.loc["instruction", "n_called_hateful"] == 2
    assert f.loc["control", "flip_rate"] == 0.0 and set(f["mitigation"]) == {"none"}
    assert f.loc["instruction", "ci"] == "wilson"                      # one copy per meme
    grouped = ce.FlipRows({f"c{k}": "instruction" for k in range(4)}, n_resamples=200, seed=0,
                          source_of={"c0": "m1", "c1": "m1", "c2": "m2", "c3": "m2"})
    grouped.add("m", "trace", [1, 1, 1, 1], [0, 0, 1, 1], ["c0", "c1", "c2", "c3"])
    g = grouped.frame().iloc[0]
    assert g["ci"] == "cluster" and g["n_memes_called_hateful"] == 2 and (g["ci_low"], g["ci_high"]) == (0.0, 1.0)
    assert ce.metric_key("TRACE memeworld-clip_cls_rel") == "trace_cls_rel"
    assert ce.metric_key("few-shot memeworld-clip/4") == "fewshot_mwclip4"
    assert ce.metric_key("debate arcade: rapid scan finds explicit cues") == "debate_arcade_rapid_scan_finds_explicit_cues"
