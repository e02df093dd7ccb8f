"""TRACE's caption controls: a shuffled source (another meme's captions of the same split, never its own) and a
cue source (the generator's account on the share of memes that buys the paper's effect), derived from notebook
01's TRACE JSON with everything else kept."""
import json
from collections import Counter

import pytest

from lib.trace.controls import ControlError, derive_source


def _source(tmp_path, n=40):
    recs = [{"id": str(i), "img": f"/x/{i}.png", "text": f"text {i}", "label": i % 2,
             "split": ["train", "dev_seen", "test_seen"][i % 3], "vlm_caption": f"caption of {i}", "grounding": []}
            for i in range(n)]
    p = tmp_path / "trace_captions.json"
    p.write_text(json.dumps(recs))
    return p, recs


def test_shuffled_captions_come_from_another_meme_of_the_same_split(tmp_path):
    src, recs = _source(tmp_path)
    out = json.loads(derive_source(src, tmp_path / "s.json", "shuffled", ["vlm_caption"], seed=1).read_text())
    split_of = {r["vlm_caption"]: r["split"] for r in recs}
    for a, b in zip(recs, out):
        assert {k: v for k, v in a.items() if k != "vlm_caption"} == {k: v for k, v in b.items() if k != "vlm_caption"}
        assert b["vlm_caption"] != a["vlm_caption"] and split_of[b["vlm_caption"]] == a["split"]
    assert Counter(r["vlm_caption"] for r in out) == Counter(r["vlm_caption"] for r in recs)   # a permutation
    again = derive_source(src, tmp_path / "t.json", "shuffled", ["vlm_caption"], seed=1).read_text()
    assert again == (tmp_path / "s.json").read_text()
    assert derive_source(src, tmp_path / "u.json", "shuffled", ["vlm_caption"], seed=2).read_text() != again


def test_the_cue_states_the_generators_account_on_the_share_of_each_split(tmp_path):
    src, recs = _source(tmp_path, 60)
    accounts = {r["id"]: {"final_reason": f"true cue {r['id']}"} for r in recs}
    out = json.loads(derive_source(src, tmp_path / "c.json", "cue", ["vlm_caption"], accounts=accounts, share=0.25).read_text())
    cued = [r for r in out if r["vlm_caption"].startswith("true cue")]
    assert Counter(r["split"] for r in cued) == {"train": 5, "dev_seen": 5, "test_seen": 5}
    assert all(r["vlm_caption"] == f"true cue {r['id']}" for r in cued)
    with pytest.raises(ControlError, match=r"record \d+ \(id '\d+'\).*final_reason"):
        derive_source(src, tmp_path / "d.json", "cue", ["vlm_caption"], accounts={}, share=1.0)
    with pytest.raises(ControlError, match="kind"):
        derive_source(src, tmp_path / "e.json", "oracle", ["vlm_caption"])


def _stage(tmp_path, n=12):
    """A TRACE JSON of `n` memes with real (blank) images and the TraceRuns of notebook 02 over it."""
    from PIL import Image
    from lib.trace.report import TraceRuns
    from lib.trace.runs import load_trace_data
    src, recs = _source(tmp_path, n)
    for r in recs:
        r["img"] = str(tmp_path / f"{r['id']}.png")
        Image.new("RGB", (8, 8)).save(r["img"])
    src.write_text(json.dumps(recs))
    return src, recs, TraceRuns({}, load_trace_data(src, ["vlm_caption"]), src, ["vlm_caption"], tmp_path / "02" / "runs")


def test_derived_runs_train_on_the_derived_source_in_a_folder_of_their_own(tmp_path):
    from lib.trace.controls import derived_runs
    src, recs, stage = _stage(tmp_path)
    shuffled = derive_source(src, tmp_path / "shuffled.json", "shuffled", ["vlm_caption"])
    runs = derived_runs(stage, shuffled, "shuffled")
    assert runs.runs_dir == tmp_path / "02" / "runs_shuffled" and runs.src == shuffled and runs.caches == {}
    caption = lambda d: [d.texts[j] for j in d.cap_index[:, 1]]       # noqa: E731  (each meme's caption)
    assert runs.data.ids == stage.data.ids and all(a != b for a, b in zip(caption(runs.data), caption(stage.data)))


def _run(right, n=96):
    """A run's saved predictions on test_seen: right on the memes in `right`."""
    preds = [{"id": str(i), "split": "test_seen", "label": i % 2, "prediction": i % 2 if i in right else 1 - i % 2}
             for i in range(n)]
    return {"eval": {"predictions": preds}}


def test_the_trace_claims_table_decides_on_seeds_and_reads_the_cue_arm_as_its_control():
    from scipy.stats import ttest_rel
    from lib.trace.controls import claim_frame
    runs = {"cls+rel": _run(set(range(60))), "image_text_only": _run(set(range(58))), "cls+con": _run(set(range(55))),
            "shuffled": _run(set(range(59))), "cue": _run(set(range(90))), "caption_only": _run(set(range(50)))}
    seeds = {"cls+rel": [_run(set(range(61))), _run(set(range(59)))],
             "image_text_only": [_run(set(range(57))), _run(set(range(56)))],
             "cue": [_run(set(range(91))), _run(set(range(88)))]}
    t, per_seed = claim_frame(runs, seeds)
    assert "verdict" not in t.columns and not t["claim"].str.startswith("control:").any()
    help_ = t[t["id"] == "trace.captions_help"].set_index("role", append=True)
    first = t[(t["id"] == "trace.captions_help") & (t["role"] == "primary")].iloc[0]
    # the trained models are the unit: a paired t over the 3 seeds' accuracy differences
    a, b = [60, 61, 59], [58, 57, 56]
    assert first["test"] == "paired t over 3 seeds" and first["runs"] == 3
    assert first["p"] == pytest.approx(float(f"{ttest_rel(a, b).pvalue:.3g}"))
    assert list(per_seed["difference"]) == pytest.approx([(x - y) / 96 for x, y in zip(a, b)])
    # beside it, the first seed's McNemar and the items pooled over seeds, both labelled secondary
    second = t[(t["id"] == "trace.captions_help") & (t["role"] == "secondary")]
    assert list(second["unit"]) == ["items", "seeds pooled"] and "sign-flip" in second.iloc[1]["test"]
    assert len(help_) == 3
    # the control: the cue arm, every seed, against B with the same test; the baseline: captions alone against A
    assert first["control"] == "cue vs image_text_only" and first["control status"] == "detected"
    assert first["control A-B"] == pytest.approx((90 + 91 + 88 - 58 - 57 - 56) / 3 / 96, abs=1e-3)
    assert (first["baseline"], first["baseline acc"]) == ("caption_only", round(50 / 96, 3))
    # a cue the model cannot use: the control says so, the claim's own numbers do not move
    runs["cue"] = _run(set(range(58)))
    weak, _ = claim_frame(runs, {**seeds, "cue": [_run(set(range(57))), _run(set(range(56)))]})
    w = weak[(weak["id"] == "trace.captions_help") & (weak["role"] == "primary")].iloc[0]
    assert w["control status"] == "not detected, short of the paper's effect"
    same = ["A-B", "95% CI A-B", "p", "design MDD", "baseline p"]
    assert w[same].tolist() == first[same].tolist()
    # an unmet precondition is its column's text, and nothing else changes
    runs["cue"] = _run(set(range(90)))
    t2, _ = claim_frame(runs, seeds, captions_precondition="not met: a linear probe gains +0.001 [-0.01, +0.01]")
    rows = t2[t2["id"].isin(["trace.captions_help", "trace.caption_content"]) & (t2["role"] == "primary")]
    assert set(rows["precondition"]) == {"not met: a linear probe gains +0.001 [-0.01, +0.01]"}
    assert t2.drop(columns="precondition").fillna("").equals(t.drop(columns="precondition").fillna(""))
    loss = t2[(t2["id"] == "trace.relevance_loss") & (t2["role"] == "primary")].iloc[0]
    assert loss["precondition"] == "not measured"


def test_the_findings_table_reads_02s_claims_table_once_a_run_wrote_one(tmp_path, monkeypatch, plan_at):
    from lib.compendium import findings
    from lib.trace.controls import claim_frame
    plan_at(96, runs=2)                                     # the synthetic runs' sizes, as the plan's
    runs = {"cls+rel": _run(set(range(60))), "image_text_only": _run(set(range(58))), "cue": _run(set(range(90)))}
    t, _ = claim_frame(runs, {"cls+rel": [_run(set(range(61)))], "image_text_only": [_run(set(range(57)))]})
    (tmp_path / "02_finetuning").mkdir()
    (tmp_path / "02_finetuning" / "metrics.json").write_text(json.dumps({"caption_benefit_acc": 0.5}))
    t.to_csv(tmp_path / "02_finetuning" / "claims.csv", index=False)
    monkeypatch.setattr(findings, "results_dir", lambda profile: tmp_path)
    rows = {r["id"]: r for r in findings.findings_rows("embedded") if r["system"] == "TRACE"}
    assert rows["trace.captions_help"]["n"] == "96 memes x 2 seeds"
    assert rows["trace.captions_help"]["test"] == "paired t over 2 seeds"
    # +0.031 over 2 seeds (p about 0.3): not significant, and the family-wise interval holds the paper's 0.10
    assert rows["trace.captions_help"]["verdict"] == "inconclusive"
    assert rows["trace.relevance_loss"]["verdict"] == "not run"                      # cls+con did not run


def test_control_runs_train_the_default_on_both_sources_for_every_seed(tmp_path, monkeypatch):
    from lib.trace import controls
    from lib.trace.report import TraceRuns
    src, recs, stage = _stage(tmp_path)
    trained, collected = [], []
    monkeypatch.setattr(TraceRuns, "train", lambda self, jobs: trained.append((self.runs_dir.name, [j[0].name for j in jobs])))
    monkeypatch.setattr(TraceRuns, "collect", lambda self, job, types=None: collected.append(job[0]) or {"dir": str(job[0])})
    accounts = {r["id"]: {"final_reason": f"true cue {r['id']}"} for r in recs}
    firsts, further = controls.control_runs(stage, src, tmp_path / "02", (None, {}, ""), [2, 3], 1, accounts)
    assert set(firsts) == set(further) == set(controls.KINDS)
    assert [name for name, _ in trained] == ["runs_shuffled", "runs_cue"]
    assert all(len(jobs) == 3 and len(set(jobs)) == 3 for _, jobs in trained)        # this seed and two more, apart
    assert all(len(v) == 2 for v in further.values()) and len(collected) == 6
    cue = json.loads((tmp_path / "02" / "trace_captions_cue.json").read_text())
    assert all(r["vlm_caption"] == f"true cue {r['id']}" for r in cue)                 # every meme states its cue
    controls.control_runs(stage, src, tmp_path / "03", (None, {}, ""), [], 1, accounts, share=0.5)
    half = json.loads((tmp_path / "03" / "trace_captions_cue.json").read_text())
    assert sum(r["vlm_caption"].startswith("true cue") for r in half) == len(half) // 2
    with pytest.raises(ControlError, match="share"):
        controls.control_runs(stage, src, tmp_path / "04", (None, {}, ""), [], 1, accounts, share=0.0)

