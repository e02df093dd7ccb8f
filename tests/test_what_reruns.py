"""A change reruns exactly what it can move: a stage goes stale when a library module it used, a prompt file it
read, or another stage's output it read changes (not for an edit to a module it never imported); every cached
trained artifact is keyed by the definitions of the code that trains it (an edit to that code retrains it, a
comment or an edit elsewhere does not). Each test edits one module in a scratch copy of the library."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lib import ROOT
from lib.compendium import artifacts, codekeys, stamps
from lib.compendium.params import load_profile, stages


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A copy of lib/ and params/ that stamps and code digests read instead of the checkout's."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "lib", root / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "params", root / "params")
    monkeypatch.setattr(stamps, "ROOT", root)
    monkeypatch.setattr(codekeys, "CODE_ROOT", [root])
    return root


def _append(root: Path, module: str, text: str) -> None:
    f = root / (module.replace(".", "/") + ".py")
    f.write_text(f.read_text() + text)


USAGE = {   # what each stage's processes recorded using (a trimmed version of a real run's records)
    "02_finetuning": {"modules": {"lib.trace.model": "lib/trace/model.py", "lib.trace.runs": "lib/trace/runs.py"},
                      "opened": ["artifacts/embedded/01_captioning/trace_captions.json",
                                 "artifacts/embedded/02_finetuning/runs/a/config.json",       # its own folder: no dependency
                                 "artifacts/embedded/cache/responses.sqlite"]},               # a cache: no dependency
    "05_debate": {"modules": {"lib.arcade.court": "lib/arcade/court.py"},
                  "opened": ["params/prompts/arcade/judge.txt", "artifacts/embedded/00_data_prep/datasets.json"]},
    "06_evaluation": {"modules": {"lib.evaluation.crosseval": "lib/evaluation/crosseval.py"},
                      "opened": ["artifacts/embedded/05_debate/results_arcade.jsonl",
                                 "results/embedded/02_finetuning/seeds.csv"]},
}


@pytest.fixture
def ran(scratch):
    """The scratch repo after a run of every stage, each recording USAGE (the others: no record, the old rule)."""
    for rel in ("artifacts/embedded/01_captioning/trace_captions.json", "artifacts/embedded/00_data_prep/datasets.json",
                "artifacts/embedded/05_debate/results_arcade.jsonl", "results/embedded/02_finetuning/seeds.csv"):
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        (scratch / rel).write_text("v1\n")
    (scratch / "params/prompts/arcade").mkdir(parents=True, exist_ok=True)
    (scratch / "params/prompts/arcade/judge.txt").write_text("judge v1\n")
    every, sections = stages(), load_profile("embedded")
    art = scratch / "artifacts"
    d = stamps.Digests()
    before = ""
    for st in every:
        usage = USAGE.get(st.name, {"modules": {}, "opened": []})
        before = s = stamps.stage_stamp(st, sections[st.name], "embedded", usage, before, d)
        f = stamps.stamp_file("embedded", st, art)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"stamp": s, "usage": usage}))
    return lambda: stamps.stale_stages(every, sections, "embedded", root=art)


def test_a_finished_run_is_up_to_date(ran):
    assert ran() == []


def test_an_edit_to_the_debate_code_reruns_the_debate_only(ran, scratch):
    _append(scratch, "lib.arcade.court", "\n\ndef a_new_rule(x):\n    return x + 1\n")
    assert ran() == ["05_debate"]


def test_a_comment_or_a_docstring_reruns_nothing(ran, scratch):
    _append(scratch, "lib.arcade.court", "\n# a comment\n")
    f = scratch / "lib/trace/model.py"
    f.write_text(f.read_text().replace('"""', '"""Edited. ', 1))
    assert ran() == []


def test_an_edit_to_trace_reruns_trace_and_not_the_debate(ran, scratch):
    _append(scratch, "lib.trace.model", "\n\nTHRESHOLD = 0.5\n")
    assert ran() == ["02_finetuning"]


def test_an_edit_to_a_module_no_stage_used_reruns_nothing(ran, scratch):
    _append(scratch, "lib.clip4dm.figures", "\n\nX = 1\n")
    assert ran() == []


def test_a_prompt_a_stage_read_reruns_it(ran, scratch):
    (scratch / "params/prompts/arcade/judge.txt").write_text("judge v2\n")
    assert ran() == ["05_debate"]


def test_an_upstream_output_that_changed_reruns_its_readers_only_when_its_bytes_change(ran, scratch):
    f = scratch / "artifacts/embedded/05_debate/results_arcade.jsonl"
    f.write_text("v1\n")                                      # rewritten, the same bytes: nothing moves
    assert ran() == []
    f.write_text("v2\n")
    assert ran() == ["06_evaluation"]
    (scratch / "results/embedded/02_finetuning/seeds.csv").write_text("v2\n")   # committed results it read count too
    assert ran() == ["06_evaluation"]
    (scratch / "artifacts/embedded/02_finetuning/runs/a").mkdir(parents=True)
    (scratch / "artifacts/embedded/02_finetuning/runs/a/config.json").write_text("{}")   # its own files: no rerun
    assert "02_finetuning" not in ran()


def test_a_stage_without_a_record_depends_on_every_module(ran, scratch):
    """A stage whose processes could not record (killed first) keeps the old rule: any library edit reruns it."""
    _append(scratch, "lib.clip4dm.figures", "\n\nX = 1\n")
    every, sections = stages(), load_profile("embedded")
    art = scratch / "artifacts"
    st = next(s for s in every if s.name == "07_figures")
    f = stamps.stamp_file("embedded", st, art)
    rec = json.loads(f.read_text())
    assert rec["usage"] == {"modules": {}, "opened": []}
    rec["usage"] = None
    f.write_text(json.dumps(rec))
    assert ran() == ["07_figures"]


# ----------------------------------------------------------------------------- trained artifacts
def test_trace_runs_are_keyed_by_their_training_code(scratch):
    from lib.trace import runs
    before = artifacts.code_of(*runs.TRAINING_CODE)
    _append(scratch, "lib.arcade.court", "\n\ndef unrelated():\n    return 1\n")
    _append(scratch, "lib.trace.model", "\n# a comment only\n")
    assert artifacts.code_of(*runs.TRAINING_CODE) == before
    _append(scratch, "lib.trace.training", "\n\ndef focal(x):\n    return 2 * x\n")
    assert artifacts.code_of(*runs.TRAINING_CODE) != before


def test_a_trace_run_is_keyed_by_the_metric_functions_it_calls_and_nothing_else_of_their_module(scratch):
    """TRACE picks its threshold and computes its result with three functions of lib.evaluation.metrics: a change in
    one of them, or in a helper they call, retrains; an edit elsewhere in the module does not."""
    from lib.trace import runs
    before = artifacts.code_of(*runs.TRAINING_CODE)
    _append(scratch, "lib.evaluation.metrics", "\n\ndef a_new_statistic(x):\n    return x + 1\n")
    assert artifacts.code_of(*runs.TRAINING_CODE) == before
    f = scratch / "lib" / "evaluation" / "metrics.py"
    text = f.read_text()
    assert "def threshold_sweep(" in text                    # a helper best_threshold reaches, not named in the key
    f.write_text(text.replace("labels: np.ndarray) -> dict[str, np.ndarray]:", "labels: np.ndarray, _changed=None) -> dict[str, np.ndarray]:", 1))
    assert artifacts.code_of(*runs.TRAINING_CODE) != before
    with pytest.raises(FileNotFoundError, match="defines no nothing_here"):
        artifacts.code_of("lib.evaluation.metrics:nothing_here")


def test_a_finished_trace_run_is_retrained_after_its_loss_changes(scratch, tmp_path):
    """is_finished reads a run back only while its identity (the training code's digest among it) is the same."""
    from types import SimpleNamespace

    import numpy as np
    from lib.trace import runs
    from lib.trace.model import TrainConfig
    data = SimpleNamespace(ids=["1", "2"], labels=np.array([0, 1]), splits=["train", "test_seen"], columns=["c"],
                           cap_index=np.zeros((2, 1), dtype=np.int64), texts=["a caption"])
    d = tmp_path / "run"
    d.mkdir()
    cfg = TrainConfig()
    (d / "config.json").write_text(json.dumps(runs.run_identity(data, "clip-vit-b32", cfg)))
    (d / "result.json").write_text("{}")
    (d / "predictions.csv").write_text("id\n")
    assert runs.is_finished(d, data, "clip-vit-b32", cfg)
    _append(scratch, "lib.sei.agents", "\n\ndef elsewhere():\n    return 0\n")
    assert runs.is_finished(d, data, "clip-vit-b32", cfg)
    _append(scratch, "lib.trace.model", "\n\ndef loss_term(x):\n    return x * 0.5\n")
    assert not runs.is_finished(d, data, "clip-vit-b32", cfg)


@pytest.mark.parametrize("module, trainer, other", [
    ("lib.sei.agents", "lib.sei.agents", "lib.trace.model"),
    ("lib.models.llm_adapt", "lib.models.llm_adapt", "lib.arcade.court"),
    ("lib.trace.interplay", "lib.trace.interplay", "lib.sei.fewshot"),
])
def test_each_trained_artifact_is_keyed_by_its_own_training_code(scratch, module, trainer, other):
    import importlib
    code = importlib.import_module(module).TRAINING_CODE
    assert trainer in code
    before = artifacts.code_of(*code)
    _append(scratch, other, "\n\ndef not_mine():\n    return 3\n")
    assert artifacts.code_of(*code) == before
    _append(scratch, trainer, "\n\ndef mine():\n    return 4\n")
    assert artifacts.code_of(*code) != before


def test_an_agents_key_and_an_adapters_digest_move_with_their_code(scratch):
    from lib.models.llm_adapt import LoraRecipe, examples_digest
    from lib.sei.agents import AgentExample, AgentRecipe, agent_key
    ex = [AgentExample("captioner", "1", Path("x.png"), {"text": "t"}, "a caption", ["a caption"], "train")]
    k1, d1 = agent_key("base", AgentRecipe(), ex, "tpl"), examples_digest([([{"role": "user", "content": "hi"}], "a")],
                                                                           LoraRecipe(), "base.gguf")
    _append(scratch, "lib.sei.agents", "\n\ndef mine():\n    return 4\n")
    _append(scratch, "lib.models.llm_adapt", "\n\ndef mine():\n    return 4\n")
    assert agent_key("base", AgentRecipe(), ex, "tpl") != k1
    assert examples_digest([([{"role": "user", "content": "hi"}], "a")], LoraRecipe(), "base.gguf") != d1


def test_an_encoders_embeddings_are_keyed_by_its_backend_code(scratch):
    from lib.models.encoders import encoder_identity
    a = encoder_identity("clip-vit-b32")
    _append(scratch, "lib.models.encoders.openclip", "\n\ndef other_backend():\n    return 1\n")
    assert encoder_identity("clip-vit-b32") == a
    _append(scratch, "lib.models.encoders.hf_clip", "\n\ndef pooled_differently():\n    return 1\n")
    assert encoder_identity("clip-vit-b32") != a


# ----------------------------------------------------------------------------- recorded from the stage's own processes
def test_a_python_steps_process_records_what_it_imported_and_opened(tmp_path):
    import os
    import subprocess
    import sys
    from lib.compendium.usage import USAGE_ENV, collect
    env = {**os.environ, USAGE_ENV: str(tmp_path / "u")}
    subprocess.run([sys.executable, "-m", "lib.compendium.nbcheck"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    u = collect(tmp_path / "u", main="lib.compendium.nbcheck")
    assert u is not None and "lib.compendium.nbcheck" in u["modules"] and "lib.compendium.execution" in u["modules"]
    assert "tests/reference/ci_checked_outputs.json" in u["opened"]                   # a file it read
    assert collect(tmp_path / "u", main="lib.models.embedded") is None               # not that step's own record


def test_a_notebooks_kernel_records_lazy_imports_after_each_cell(tmp_path):
    """The kernel may be stopped without atexit (nbval stops it at once): it records after every cell, lazy imports
    and registries included; a notebook whose kernel left no record counts as using everything."""
    import os
    import nbformat
    import papermill as pm
    from lib.compendium.usage import USAGE_ENV, collect
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import importlib\nm = importlib.import_module('lib.arcade.' + 'scoring')"),
                nbformat.v4.new_code_cell("open(%r).read()" % str(ROOT / "params" / "ci.yaml"))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src = tmp_path / "t.ipynb"
    nbformat.write(nb, str(src))
    old = os.environ.get(USAGE_ENV)
    os.environ[USAGE_ENV] = str(tmp_path / "u")
    try:
        pm.execute_notebook(str(src), str(tmp_path / "o.ipynb"), kernel_name="python3", progress_bar=False)
    finally:
        os.environ.pop(USAGE_ENV) if old is None else os.environ.__setitem__(USAGE_ENV, old)
    u = collect(tmp_path / "u")
    assert u is not None and "lib.arcade.scoring" in u["modules"] and "params/ci.yaml" in u["opened"]
    assert collect(tmp_path / "nothing") is None


def test_a_stage_whose_code_changed_while_it_ran_gets_no_stamp():
    """The stamp is computed when the stage ends: a module or parameter file it used that was edited after it
    started would be stamped as run when it was not, so such a stage is named and left to rerun."""
    import time as _time
    from lib.compendium.params import stages
    from lib.compendium.stamps import changed_during
    st = next(s for s in stages() if s.name == "02_finetuning")
    usage = {"modules": {"lib.compendium.stamps": "lib/compendium/stamps.py"},
             "opened": ["params/prompts/sei/system.txt", "lib/trace/model.py"]}
    assert changed_during(st, usage, "embedded", _time.time() + 60) == []
    assert changed_during(st, usage, "embedded", 0.0) == ["lib/compendium/stamps.py"] + (
        ["params/prompts/sei/system.txt"] if (ROOT / "params/prompts/sei/system.txt").exists() else [])
    assert changed_during(st, None, "embedded", 0.0) == []
