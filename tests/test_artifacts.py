"""Atomic writes, manifests, metrics and missing-input messages."""
import json

import pytest

from lib.compendium import artifacts
from lib.compendium.artifacts import MissingInputError, atomic_path, require, write_json, write_manifest, write_metrics


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "a.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temp files left behind


def test_manifest_records_params_revision_and_packages(tmp_path):
    write_manifest(tmp_path, {"lr": 1e-4, "n": 3}, outputs=["x"])
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["params"] == {"lr": 1e-4, "n": 3} and len(m["params_hash"]) == 16
    assert m["git_revision"] and "torch" in m["packages"] and m["outputs"] == ["x"]
    write_manifest(tmp_path, {"lr": 2e-4, "n": 3})
    assert json.loads((tmp_path / "manifest.json").read_text())["params_hash"] != m["params_hash"]


def test_metrics_must_be_flat(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "ARTIFACTS_ROOT", tmp_path)
    p = write_metrics("embedded", "09_x", {"acc": 0.5, "n": 3})
    assert json.loads(p.read_text()) == {"acc": 0.5, "n": 3}
    with pytest.raises(TypeError, match="flat"):
        write_metrics("embedded", "09_x", {"per_type": {"001": 0.1}})


def test_missing_input_names_the_producing_target(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "ARTIFACTS_ROOT", tmp_path)
    with pytest.raises(MissingInputError) as e:
        require("paper", "datasets", "notebooks/02_finetuning.ipynb")
    msg = str(e.value)
    assert "make reproduce NB=00" in msg and "PROFILE=paper" in msg and "02_finetuning" in msg


def test_jsonl_never_writes_a_key_prefix_and_reads_back_the_same_rows(tmp_path):
    """Model text holding "sk-" ("Task-Task", "SK-9") is written with the hyphen escaped, so no committed
    file carries what a credential scanner flags, and the rows read back unchanged."""
    from lib.compendium.artifacts import read_jsonl, write_jsonl
    rows = [{"name": "Sentence-Task-Task", "raw": "\\sk-x\tSK-9 ask-me", "n": 3}, {"plain": "no prefix"}]
    f = write_jsonl(tmp_path / "r.jsonl", rows)
    text = f.read_text(encoding="utf-8")
    assert "sk-" not in text.lower() and "no prefix" in text
    assert read_jsonl(f) == rows
