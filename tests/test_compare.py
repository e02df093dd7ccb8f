"""lib.compendium.compare: two runs of one profile agree when only where and when they ran differs, and
any moved result is named."""
from __future__ import annotations

import json
import re

import pytest

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


# ---------------------------------------------------------------- a comparison that cannot pass on nothing
def _stage(root, stage="02_finetuning", metrics=None, **files):
    d = root / stage
    d.mkdir(parents=True, exist_ok=True)
    if metrics is not None:
        (d / "metrics.json").write_text(metrics if isinstance(metrics, str) else json.dumps(metrics))
    for name, text in files.items():
        (d / name.replace("__", ".")).write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


def test_two_empty_folders_are_an_error_not_identical(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "holds no stage results" in err and str(tmp_path / "a") in err


def test_folders_with_only_caches_and_notebooks_hold_nothing_to_compare(tmp_path, capsys):
    for r in ("a", "b"):
        (tmp_path / r / "cache").mkdir(parents=True)
        (tmp_path / r / "cache" / "x.json").write_text("{}")
        (tmp_path / r / "timings.json").write_text("{}")
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "holds no stage results" in capsys.readouterr().err


def test_runs_with_no_stage_in_common_are_an_error_naming_each_runs_stages(tmp_path, capsys):
    _stage(tmp_path / "a", "02_finetuning", {"acc": 1})
    _stage(tmp_path / "b", "05_debate", {"acc": 1})
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "no stage in common" in err and "02_finetuning" in err and "05_debate" in err


def test_a_stage_in_one_run_only_is_listed_and_the_common_one_compared(tmp_path, capsys):
    """A child profile that ran one stage compares with a full run on that stage."""
    a = _stage(_stage(tmp_path / "full", "02_finetuning", {"acc": 0.7}), "05_debate", {"acc": 0.5})
    b = _stage(tmp_path / "child", "02_finetuning", {"acc": 0.7})
    rep = compare_runs(a, b)
    assert rep["identical"] and rep["stages"] == {"compared": ["02_finetuning"], "only_in_a": ["05_debate"], "only_in_b": []}
    assert main([str(a), str(b)]) == 0
    assert "only in a (not compared): 05_debate" in capsys.readouterr().out
    _stage(b, "02_finetuning", {"acc": 0.8})
    assert main([str(a), str(b)]) == 1
    assert "acc: 0.7 -> 0.8" in capsys.readouterr().out


def test_stages_in_common_with_nothing_in_common_are_an_error(tmp_path, capsys):
    _stage(tmp_path / "a", "02_finetuning", None, x__csv="a\n1\n")
    _stage(tmp_path / "b", "02_finetuning", None, y__csv="a\n1\n")
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "nothing was compared" in capsys.readouterr().err


@pytest.mark.parametrize("metrics, message", [
    ("[1, 2]", r"metrics.json: a JSON list, expected an object of metric -> value"),
    ('"text"', r"metrics.json: a JSON str, expected an object"),
    ('{"acc": 0.5', r"metrics.json: malformed JSON at line 1 column 12"),
])
def test_a_malformed_metrics_file_is_named_with_the_reason(tmp_path, capsys, metrics, message):
    _stage(tmp_path / "a", "02_finetuning", {"acc": 1})
    _stage(tmp_path / "b", "02_finetuning", metrics)
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and str(tmp_path / "b" / "02_finetuning" / "metrics.json") in err


@pytest.mark.parametrize("name, text, message", [
    ("settings__json", '{"a": [1, 2', r"settings.json: malformed JSON at line 1 column 12"),
    ("rows__jsonl", '{"a": 1}\n{"a": \n', r"rows.jsonl: malformed JSON at line 2"),
    ("table__csv", b"a,b\n\xff\xfe,1\n", r"table.csv: byte 4 is not UTF-8"),
])
def test_a_malformed_result_file_is_named_with_the_reason(tmp_path, capsys, name, text, message):
    good = {"settings__json": '{"a": 1}', "rows__jsonl": '{"a": 1}\n', "table__csv": "a,b\n1,2\n"}[name]
    _stage(tmp_path / "a", "02_finetuning", {"acc": 1}, **{name: good})
    _stage(tmp_path / "b", "02_finetuning", {"acc": 1}, **{name: text})
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and str(tmp_path / "b" / "02_finetuning") in err and "Traceback" not in err


def test_out_must_be_a_file_path(tmp_path, capsys):
    a = _stage(tmp_path / "a", "02_finetuning", {"acc": 1})
    b = _stage(tmp_path / "b", "02_finetuning", {"acc": 1})
    (tmp_path / "reports").mkdir()
    assert main([str(a), str(b), "--out", str(tmp_path / "reports")]) == 2
    assert "--out" in capsys.readouterr().err and not any((tmp_path / "reports").iterdir())
    assert main([str(a), str(b), "--out", str(tmp_path / "reports" / "r.json")]) == 0
    assert json.loads((tmp_path / "reports" / "r.json").read_text())["identical"]


def test_a_run_compares_with_committed_results_on_what_a_run_publishes(tmp_path):
    """results/<profile>/ holds only the published files (some gzipped): a run's folder compares with it on those,
    its models, caches and other working files set aside."""
    run = _stage(tmp_path / "artifacts" / "child", "02_finetuning", {"acc": 1}, seeds__csv="seed,acc\n0,1\n",
                 tokenizer__json='{"vocab": 1}')
    pub = _stage(tmp_path / "results" / "embedded", "02_finetuning", {"acc": 1})
    (pub / "notebooks.json").write_text("{}")
    (pub / "02_finetuning" / "seeds.csv.gz").write_bytes(__import__("gzip").compress(b"seed,acc\n0,1\n"))
    rep = compare_runs(run, pub)
    assert rep["identical"] and rep["published_only"] and rep["files"]["compared"] == 1, rep
    (pub / "02_finetuning" / "seeds.csv.gz").write_bytes(__import__("gzip").compress(b"seed,acc\n0,0\n"))
    assert compare_runs(run, pub)["files"]["differ"] == ["02_finetuning/seeds.csv"]
