"""The precondition table: each method's measured precondition with its interval against its threshold, read
from the per-item files a run writes; "met" only when the whole interval clears the threshold."""
import json

import pytest

from lib.evaluation.preconditions import precondition_block, precondition_rows


def _root(tmp_path, agree=0.9, zero_right=0.8, judge_ones=0.5, benefit=(0.06, 0.02, 0.10)):
    n = 100
    (tmp_path / "00_data_prep").mkdir(parents=True)
    (tmp_path / "00_data_prep" / "memes.csv").write_text(
        "id,split,label\n" + "".join(f"{i},x,{i % 2}\n" for i in range(2 * n)))
    (tmp_path / "04_few_shot").mkdir()
    # query i (0..n-1) gets 4 exemplars: `agree` of them share its label
    ex = {str(i): [[str(n + (i % 2 if k < round(4 * agree) else 1 - i % 2) + 2 * k), 0.9] for k in range(4)] for i in range(n)}
    (tmp_path / "04_few_shot" / "exemplars_fhm_enc.json").write_text(json.dumps(ex))
    preds = [{"setting": "zero_shot", "gold": i % 2, "status": "ok",
              "label": i % 2 if i < zero_right * n else 1 - i % 2} for i in range(n)]
    (tmp_path / "04_few_shot" / "predictions_fhm.jsonl").write_text("\n".join(json.dumps(p) for p in preds))
    (tmp_path / "05_debate").mkdir()
    (tmp_path / "05_debate" / "results_arcade.jsonl").write_text(
        "\n".join(json.dumps({"label": 1 if i < judge_ones * n else 0}) for i in range(n)))
    (tmp_path / "02_finetuning").mkdir()
    (tmp_path / "02_finetuning" / "metrics.json").write_text(json.dumps(
        {"caption_benefit_acc": benefit[0], "caption_benefit_ci_low": benefit[1], "caption_benefit_ci_high": benefit[2],
         "caption_benefit_n": 500}))
    return tmp_path


def test_each_precondition_is_met_only_when_its_interval_clears_the_threshold(tmp_path):
    rows = {r["method"]: r for r in precondition_rows(_root(tmp_path / "a"))}
    assert [r["status"] for r in rows.values()] == ["met"] * 4
    assert rows["See, Explain, Intervene"]["value"] == pytest.approx(1.0)
    weak = {r["method"]: r for r in precondition_rows(_root(tmp_path / "b", agree=0.5, zero_right=0.55, judge_ones=0.99,
                                                            benefit=(0.01, -0.01, 0.03)))}
    assert [r["status"] for r in weak.values()] == ["not met"] * 4
    assert weak["ARCADE"]["value"] == pytest.approx(0.99) and weak["See, Explain, Intervene"]["value"] == pytest.approx(0.5)
    block = precondition_block(tmp_path / "b")
    assert block.count("\n") == 5 and "| not met |" in block


def test_a_run_without_the_files_has_no_rows(tmp_path):
    assert precondition_rows(tmp_path) == [] and "make reproduce" in precondition_block(tmp_path)


def test_every_retriever_and_the_oracle_judge_get_a_row_the_image_only_retriever_first(tmp_path):
    root = _root(tmp_path)
    ex = json.loads((root / "04_few_shot" / "exemplars_fhm_enc.json").read_text())
    (root / "04_few_shot" / "exemplars_fhm_enc+text.json").write_text(json.dumps(ex))
    (root / "05_debate" / "results_oracle.jsonl").write_text("\n".join(json.dumps({"label": 1}) for _ in range(50)))
    rows = precondition_rows(root)
    sei = [r["measured"] for r in rows if r["method"] == "See, Explain, Intervene"]
    assert len(sei) == 2 and "(enc, n = 4" in sei[0] and "(enc+text, n = 4" in sei[1]
    judge = [r for r in rows if r["method"] == "ARCADE"]
    assert len(judge) == 2 and "oracle" in judge[1]["measured"] and judge[1]["status"] == "not met"
    (root / "05_debate" / "results_oracle.jsonl").write_text("\n".join(
        json.dumps({"label": i % 3, "gt": i % 3, "status": "ok"}) for i in range(60)))
    told = [r for r in precondition_rows(root) if r["precondition"] == "the judge can tell the categories from a debate"]
    assert len(told) == 1 and told[0]["value"] == pytest.approx(1.0) and told[0]["status"] == "met"
    (root / "05_debate" / "results_oracle.jsonl").write_text("\n".join(
        json.dumps({"label": 1, "gt": i % 3, "status": "ok"}) for i in range(60)))    # one label whatever the cue
    told = [r for r in precondition_rows(root) if r["precondition"] == "the judge can tell the categories from a debate"]
    assert told[0]["value"] == pytest.approx(1 / 3, abs=0.01) and told[0]["status"] == "not met"


def test_trace_reads_the_probe_per_caption_source_before_the_trained_benefit(tmp_path):
    root = _root(tmp_path)
    m = json.loads((root / "02_finetuning" / "metrics.json").read_text())
    m.update({"probe_captions_label_gain": -0.003, "probe_captions_label_ci_low": -0.02, "probe_captions_label_ci_high": 0.015,
              "probe_captions_label_n": 998, "probe_cue_label_gain": 0.2, "probe_cue_label_ci_low": 0.17,
              "probe_cue_label_ci_high": 0.23, "probe_cue_label_n": 998})
    (root / "02_finetuning" / "metrics.json").write_text(json.dumps(m))
    trace = [r for r in precondition_rows(root) if r["method"] == "TRACE"]
    assert [r["status"] for r in trace] == ["not met", "met"]
    assert "the run's captions" in trace[0]["measured"] and "cue captions" in trace[1]["measured"]
    assert trace[0]["n"] == "998 memes" and trace[1]["value"] == pytest.approx(0.2)


def test_retrieval_status_names_each_retriever_for_the_claims_table(tmp_path):
    from lib.evaluation.preconditions import retrieval_status
    root = _root(tmp_path)
    ex = json.loads((root / "04_few_shot" / "exemplars_fhm_enc.json").read_text())
    weak = {q: [[str(100 + (1 - int(q) % 2) + 2 * k), 0.9] for k in range(4)] for q in ex}     # never the label
    (root / "04_few_shot" / "exemplars_fhm_enc+text.json").write_text(json.dumps(weak))
    assert retrieval_status(root) == {"enc": True, "enc+text": False}
    assert all("component" not in r for r in precondition_rows(root))


def test_judge_status_reads_the_oracle_judge_for_the_debate_claims(tmp_path):
    from lib.evaluation.preconditions import judge_status
    root = _root(tmp_path)
    assert judge_status(root) is None                                     # no oracle variant ran: not measured
    oracle = root / "05_debate" / "results_oracle.jsonl"
    oracle.write_text("\n".join(json.dumps({"label": i % 3, "gt": i % 3, "status": "ok"}) for i in range(60)))
    assert judge_status(root) is True
    oracle.write_text("\n".join(json.dumps({"label": 1, "gt": i % 3, "status": "ok"}) for i in range(60)))
    assert judge_status(root) is False


def test_the_adapted_judge_has_its_own_rows_and_status(tmp_path):
    from lib.evaluation.preconditions import judge_status, precondition_rows
    root = _root(tmp_path)
    d = root / "05_debate"
    (d / "results_oracle.jsonl").write_text("\n".join(json.dumps({"label": 1, "gt": i % 3, "status": "ok"}) for i in range(60)))
    (d / "results_oracle_adapted.jsonl").write_text("\n".join(json.dumps({"label": i % 3, "gt": i % 3, "status": "ok"})
                                                             for i in range(60)))
    (d / "results_arcade_adapted.jsonl").write_text("\n".join(json.dumps({"label": i % 2, "gt": 0, "status": "ok"})
                                                             for i in range(60)))
    assert (judge_status(root), judge_status(root, "oracle_adapted")) == (False, True)
    rows = {(r["method"], r["measured"]): r for r in precondition_rows(root)}
    adapted = "ARCADE, judge adapted to MemeWorld (LoRA)"
    assert rows[(adapted, "judge accuracy when the debaters state the true cue (oracle)")]["status"] == "met"
    assert rows[(adapted, "share of the judge's most common label")]["value"] == 0.5
    assert not any(m.endswith("(control)") for m, _ in rows)              # the control's run is absent: no row


def test_each_debate_claim_reads_the_judges_precondition_on_its_own_posts(tmp_path):
    """The emergent-hate claims are decided on type-001 posts alone: their precondition is the oracle court's
    accuracy there (falling back to the sampled posts' oracle where no type-001 oracle ran); the others read the
    sampled posts' oracle. Each oracle run has its row in the table. The gate's claim is no judge's (its route is
    the rapid scan's), so it reads no judge precondition."""
    from lib.arcade.report import CLAIMS, GATE_CLAIM, judge_preconditions
    from lib.evaluation.preconditions import precondition_rows
    root = _root(tmp_path)
    d = root / "05_debate"
    t2 = [c for c, *_ in CLAIMS if c.startswith("Track II")]
    assert len(t2) == 2 and set(judge_preconditions(root).values()) == {None}     # no oracle ran: not measured
    assert GATE_CLAIM[0] not in judge_preconditions(root)
    wrong = "\n".join(json.dumps({"label": 1, "gt": i % 3, "status": "ok"}) for i in range(60))
    right = "\n".join(json.dumps({"label": 1 + i % 2, "gt": 1 + i % 2, "status": "ok"}) for i in range(60))
    (d / "results_oracle_adapted.jsonl").write_text(wrong)
    assert set(judge_preconditions(root, "_adapted").values()) == {False}         # the fallback for every claim
    (d / "results_oracle_type001_adapted.jsonl").write_text(right)
    pre = judge_preconditions(root, "_adapted")
    assert {c: pre[c] for c in t2} == dict.fromkeys(t2, True)
    assert {c: v for c, v in pre.items() if c not in t2} == {c: False for c, *_ in CLAIMS if c not in t2}
    rows = {r["measured"]: r for r in precondition_rows(root) if r["method"] == "ARCADE, judge adapted to MemeWorld (LoRA)"}
    on_type001 = [m for m in rows if m.endswith("the Track II claims are decided on")]
    assert len(on_type001) == 1 and rows[on_type001[0]]["status"] == "met" and rows[on_type001[0]]["value"] == 1.0
