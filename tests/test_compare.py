"""lib.compendium.compare: two runs of one profile agree when only where and when they ran differs, and
any moved result is named."""
from __future__ import annotations

import json

from lib.compendium.compare import compare_runs, main


def _run(root, value=0.75, seconds=1.0, cached=False, label=1):
    st = root / "04_few_shot"
    st.mkdir(parents=True)
    (st / "metrics.json").write_text(json.dumps({"accuracy": value, "wall_s": seconds, "calls": 0 if cached else 8}))
    rows = [{"id": "1", "img": str(root / "00_data_prep" / "img" / "1.png"), "label": label,
             "from_cache": cached, "calls": [{"stage": "judge", "from_cache": cached, "latency_s": seconds}]}]
    (st / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (st / "table.csv").write_text(f"setting,accuracy,pairs/s (batched)\nmain,{value},{100 * seconds}\n")
    (st / ".stamp.json").write_text(json.dumps({"code": str(seconds)}))
    return root


def test_runs_that_differ_only_in_folder_time_and_cache_are_identical(tmp_path):
    a = _run(tmp_path / "a" / "ci")
    b = _run(tmp_path / "elsewhere" / "ci", seconds=2.5, cached=True)
    rep = compare_runs(a, b)
    assert rep["identical"], rep
    assert rep["metrics"]["04_few_shot"]["identical"] and rep["files"]["compared"] == 2


def test_a_moved_metric_or_prediction_is_named(tmp_path, capsys):
    a = _run(tmp_path / "a")
    rep = compare_runs(a, _run(tmp_path / "b", value=0.76))
    assert not rep["identical"]
    assert any(line.startswith("accuracy: 0.75 -> 0.76") for line in rep["metrics"]["04_few_shot"]["differ"])
    assert rep["files"]["differ"] == ["04_few_shot/table.csv"]
    rep = compare_runs(a, _run(tmp_path / "c", label=0))
    assert rep["metrics"]["04_few_shot"]["identical"] and rep["files"]["differ"] == ["04_few_shot/predictions.jsonl"]
    assert main([str(a), str(tmp_path / "c"), "--out", str(tmp_path / "r.json")]) == 1
    assert json.loads((tmp_path / "r.json").read_text())["files"]["differ"] == ["04_few_shot/predictions.jsonl"]
    assert "differs: 04_few_shot/predictions.jsonl" in capsys.readouterr().out


def test_a_missing_run_folder_is_refused(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err
