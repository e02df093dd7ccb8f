"""A stage chosen alone gets what it reads: committed results copied (never written back, removed before that stage
runs here itself), what is not committed regenerated only when asked (DEPS=1, after saying what and how long);
and nothing reports success on nothing: a stage that wrote less than it declares never replaces a saved notebook
or publishes, a figures run that drew nothing fails, a rerun that moves no result leaves the committed files."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import nbformat
import pytest

import lib.compendium.results as results
import lib.compendium.stages as stages_mod
from lib.compendium import inputs
from lib.compendium.outputs import OutputsMissing, check_outputs
from lib.compendium.params import Stage, stages

ORDER = [s.name for s in stages()]


@pytest.fixture
def tree(tmp_path):
    """artifacts/ and results/ of a profile in a temp folder, every stage committed but 07."""
    art, res = tmp_path / "artifacts", tmp_path / "results"
    for st in ORDER[:-1]:
        d = res / "embedded" / st
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"acc": 0.5}))
    (res / "embedded" / "02_finetuning" / "seeds.csv.gz").write_bytes(gzip.compress(b"seed,acc\n0,0.5\n", mtime=0))
    img = res / "embedded" / "06_evaluation" / inputs.FIGURE_IMAGES / "00_data_prep" / "memeworld" / "img" / "1.png"
    img.parent.mkdir(parents=True)
    img.write_bytes(b"\x89PNG a gallery image")
    return art, res


def test_figures_take_every_committed_stage_and_regenerate_nothing(tree):
    art, res = tree
    p = inputs.plan("embedded", ["07_figures"], art, res)
    assert p.copy == ORDER[:-1] and p.run == [] and p.trace_runs == [] and not p.regenerates


def test_the_evaluation_takes_the_committed_predictions_and_regenerates_what_is_not_committed(tree):
    art, res = tree
    p = inputs.plan("embedded", ["06_evaluation"], art, res)
    assert p.run == ["00_data_prep", "models", "01_captioning"]
    assert p.copy == ["02_finetuning", "03_clip4dm", "04_few_shot", "05_debate"]
    assert p.trace_runs == inputs.trace_runs_needed("embedded") and len(p.trace_runs) == 4
    (art / "embedded" / "01_captioning").mkdir(parents=True)
    (art / "embedded" / "01_captioning" / ".stamp.json").write_text("{}")     # finished here: used as it is
    assert "01_captioning" not in inputs.plan("embedded", ["06_evaluation"], art, res).run


def test_a_profile_with_nothing_committed_must_run_what_a_stage_reads(tmp_path):
    p = inputs.plan("ci", ["02_finetuning"], tmp_path / "a", tmp_path / "r")
    assert p.run == ["00_data_prep", "models", "01_captioning"] and p.copy == [] and p.missing


def test_committed_results_are_copied_unpacked_marked_and_never_over_a_runs_own_file(tree):
    art, res = tree
    own = art / "embedded" / "02_finetuning" / "metrics.json"
    own.parent.mkdir(parents=True)
    own.write_text('{"acc": 0.9}')                                           # a file a run wrote here
    copied = inputs.take_from_results("embedded", "02_finetuning", art, res)
    assert copied == ["seeds.csv"] and own.read_text() == '{"acc": 0.9}'
    assert (art / "embedded" / "02_finetuning" / "seeds.csv").read_bytes() == b"seed,acc\n0,0.5\n"
    assert inputs.taken("embedded", "02_finetuning", art)["files"] == ["seeds.csv"]
    assert inputs.drop_taken("embedded", "02_finetuning", art) == 1           # before 02 runs here itself
    assert not (art / "embedded" / "02_finetuning" / "seeds.csv").exists() and own.exists()
    assert not inputs.taken("embedded", "02_finetuning", art)


def test_the_images_a_figure_shows_go_back_where_the_figure_reads_them(tree):
    art, res = tree
    inputs.take_from_results("embedded", "06_evaluation", art, res)
    img = art / "embedded" / "00_data_prep" / "memeworld" / "img" / "1.png"
    assert img.read_bytes() == b"\x89PNG a gallery image"
    inputs.drop_taken("embedded", "06_evaluation", art)
    assert img.exists()                # another stage's folder: what 00 generates too, left for it


def test_published_figure_images_are_those_the_figure_inputs_name(tmp_path, monkeypatch):
    from lib import ROOT
    folder = tmp_path / "artifacts" / "embedded" / "06_evaluation"
    folder.mkdir(parents=True)
    img = tmp_path / "artifacts" / "embedded" / "00_data_prep" / "memeworld" / "img" / "7.png"
    img.parent.mkdir(parents=True)
    img.write_bytes(b"png")
    (folder / "gallery.json").write_text(json.dumps([{"img": str(img)}, {"img": str(ROOT / "nope.png")}]))
    out = inputs.publish_figure_images("embedded", "06_evaluation", folder, tmp_path / "results")
    assert out == [f"{inputs.FIGURE_IMAGES}/00_data_prep/memeworld/img/7.png"]
    assert (tmp_path / "results" / out[0]).read_bytes() == b"png"


@pytest.fixture
def sandbox(tree, monkeypatch):
    art, res = tree
    monkeypatch.setattr(stages_mod, "ARTIFACTS_ROOT", art)
    monkeypatch.setattr(results, "ARTIFACTS_ROOT", art)
    monkeypatch.setattr(results, "RESULTS_ROOT", res)
    monkeypatch.setattr("lib.models.chat.cache.ROOT", art.parent)      # the real profiles' caches are never touched
    ran = []
    monkeypatch.setattr(stages_mod, "run_notebook", lambda st, p, params=None, **kw: ran.append(st.name))
    monkeypatch.setattr(stages_mod, "run_module", lambda st, p, **kw: ran.append(st.name))
    monkeypatch.setattr(stages_mod, "check_outputs", lambda *a, **k: None)
    return art, res, ran


def test_a_stage_that_needs_regenerating_stops_first_and_says_what_and_how_long(sandbox, capsys):
    art, res, ran = sandbox
    assert stages_mod.reproduce("embedded", "06", publish=False) == 2
    out, err = capsys.readouterr()
    assert ran == [] and "taken from results/embedded/" in out and "regenerated here first" in out
    assert "4 TRACE runs of 02_finetuning retrained" in out and "before 06_evaluation starts" in out
    assert "DEPS=1" in err and "00_data_prep" in err
    assert not (art / "embedded" / "02_finetuning").exists()               # nothing copied before it is asked


def test_a_profile_without_committed_inputs_fails_before_it_starts_naming_what_to_run(sandbox, capsys):
    art, res, ran = sandbox
    assert stages_mod.reproduce("ci", "02", publish=False) == 2
    err = capsys.readouterr().err
    assert ran == [] and "make reproduce NB=00_data_prep PROFILE=ci" in err and "DEPS=1" in err


def test_with_deps_the_inputs_are_regenerated_then_the_stage_runs(sandbox, monkeypatch, capsys):
    art, res, ran = sandbox
    calls = []
    real = stages_mod.subprocess.run
    monkeypatch.setattr(stages_mod.subprocess, "run", lambda cmd, **kw: calls.append(cmd) if "lib.trace.runs" in cmd
                        else real(cmd, **kw))
    assert stages_mod.reproduce("embedded", "06", publish=False, deps=True) == 0
    assert ran == ["00_data_prep", "models", "01_captioning", "06_evaluation"]
    assert calls and "--retrain-committed" in calls[0]
    assert inputs.taken("embedded", "05_debate", art)["from"] == "results/embedded/05_debate"
    t = json.loads((art / "embedded" / "timings.json").read_text())
    assert "06_evaluation" not in t.get("stages", {}) and "06_evaluation" not in t.get("replayed", {})  # borrowed inputs


def test_figures_run_on_committed_results_without_asking(sandbox):
    art, res, ran = sandbox
    assert stages_mod.reproduce("embedded", "07", publish=False) == 0
    assert ran == ["07_figures"] and inputs.taken("embedded", "06_evaluation", art)


# ----------------------------------------------------------------------------- nothing reports success on nothing
def test_a_stage_must_write_its_own_non_empty_metrics(tmp_path):
    import time
    d = tmp_path / "embedded" / "02_finetuning"
    d.mkdir(parents=True)
    with pytest.raises(OutputsMissing, match="metrics.json was not written"):
        check_outputs("embedded", "02_finetuning", tmp_path)
    (d / "metrics.json").write_text("{}")
    with pytest.raises(OutputsMissing, match="holds no metric"):
        check_outputs("embedded", "02_finetuning", tmp_path)
    (d / "metrics.json").write_text('{"acc": 1}')
    check_outputs("embedded", "02_finetuning", tmp_path)
    with pytest.raises(OutputsMissing, match="an earlier run's"):
        check_outputs("embedded", "02_finetuning", tmp_path, since=time.time() + 60)
    (d / "seeds.csv").write_text("")
    with pytest.raises(OutputsMissing, match="seeds.csv is empty"):
        check_outputs("embedded", "02_finetuning", tmp_path)


def test_a_notebook_that_writes_nothing_keeps_the_saved_notebook(tmp_path):
    from lib.compendium.stages import StageError, run_notebook
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell('profile = "embedded"')
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, nbformat.v4.new_code_cell("print('ran, wrote nothing')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src = tmp_path / "09_empty.ipynb"
    nbformat.write(nb, str(src))
    before = src.read_bytes()
    st = Stage("09_empty", notebook=src)
    with pytest.raises(StageError, match="finished without writing what it declares"):
        run_notebook(st, "embedded", {}, check=lambda: check_outputs("embedded", "09_empty", tmp_path / "art"))
    assert src.read_bytes() == before                 # the saved (here: committed) notebook stays as it was


def test_a_figures_run_that_drew_nothing_fails():
    from lib.evaluation import figures
    rows = [{"name": n, "status": "not drawn: artifacts/x missing", "artifacts": ["06_evaluation/comparison.csv"]}
            for n in list(figures.REGISTRY)[:3]]
    with pytest.raises(figures.FiguresNotDrawn, match="no figure drawn"):
        figures.require_drawn(rows, "embedded")


def test_a_figure_left_out_while_its_inputs_are_committed_fails():
    from lib.evaluation import figures
    f = next(f for f in figures.REGISTRY.values() if not f.optional and f.name.startswith("evaluation_mcnemar"))
    rows = [{"name": "x", "status": "drawn", "artifacts": []},
            {"name": f.name, "status": "not drawn: missing", "artifacts": f.relpaths()}]
    with pytest.raises(figures.FiguresNotDrawn, match=f.name):
        figures.require_drawn(rows, "embedded")


def test_a_rerun_that_moves_no_result_leaves_the_committed_file(tmp_path):
    from lib.compendium.bookkeeping import same_result
    f = tmp_path / "metrics.json"
    f.write_text(json.dumps({"acc": 0.5, "interplay_train_s": 12.0}))
    assert same_result(f, json.dumps({"acc": 0.5, "interplay_train_s": 13.5}).encode())
    assert not same_result(f, json.dumps({"acc": 0.51, "interplay_train_s": 12.0}).encode())
    r = tmp_path / "result.json"
    r.write_text(json.dumps({"eval": {"acc": 1}, "seconds": 117.2}))
    assert same_result(r, json.dumps({"eval": {"acc": 1}, "seconds": 90.0}).encode())
    # a run's identity is no bookkeeping: a config.json whose training code moved is published (the next run of a
    # child profile, or of a fresh clone, compares its identity with it)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"backbone": "b", "training_code": "a"}))
    assert not same_result(cfg, json.dumps({"backbone": "b", "training_code": "b"}).encode())
    # a response-cache key is bookkeeping; a model's answer field that happens to be named "key" is not
    k = tmp_path / "answers.jsonl"
    k.write_text(json.dumps({"key": "a" * 64, "label": 1}) + "\n")
    assert same_result(k, (json.dumps({"key": "b" * 64, "label": 1}) + "\n").encode())
    k.write_text(json.dumps({"key": "the cue", "label": 1}) + "\n")
    assert not same_result(k, (json.dumps({"key": "another cue", "label": 1}) + "\n").encode())
    # a rate per second is a timing; what a protocol costs per sample, and a generation setting, are results
    t = tmp_path / "cost.json"
    t.write_text(json.dumps({"tokens_per_s": 40.0, "pairs_per_s_floor": 3.0, "calls_per_sample": 4.0,
                             "tokens_per_sample": 900.0, "max_new_tokens": 64}))
    assert same_result(t, json.dumps({"tokens_per_s": 41.0, "pairs_per_s_floor": 2.0, "calls_per_sample": 4.0,
                                      "tokens_per_sample": 900.0, "max_new_tokens": 64}).encode())
    from lib.compendium.bookkeeping import bookkeeping
    assert bookkeeping("pairs/s (batched, ready pixels)", 3.0) and not bookkeeping("calls/sample", 4.0)
    for key, moved in (("calls_per_sample", 3.5), ("tokens_per_sample", 800.0), ("max_new_tokens", 128)):
        again = {**json.loads(t.read_text()), key: moved}
        assert not same_result(t, json.dumps(again).encode()), key
    c = tmp_path / "p.csv.gz"
    c.write_bytes(gzip.compress(b"id,pred,wall_s\n1,0,3.2\n"))
    assert same_result(c, gzip.compress(b"id,pred,wall_s\n1,0,9.9\n")) and not same_result(c, gzip.compress(b"id,pred,wall_s\n1,1,3.2\n"))


def test_a_child_keeps_its_parents_outputs_current_and_never_overwrites_its_own(tmp_path):
    """take_from_parent copies the parent's outputs of an inherited stage; when the parent reruns, what was taken is
    refreshed, a file the child's own run wrote is left alone, and the marker lists every taken file."""
    art = tmp_path / "artifacts"
    parent = art / "embedded" / "03_clip4dm"
    parent.mkdir(parents=True)
    (parent / "metrics.json").write_text('{"ap": 0.7}')
    (parent / ".stamp.json").write_text("{}")
    assert inputs.take_from_parent("child", "03_clip4dm", "embedded", root=art) == ["metrics.json"]
    child = art / "child" / "03_clip4dm"
    assert not (child / ".stamp.json").exists()                      # the child never ran it
    (child / "own.csv").write_text("a\n1\n")                         # the child's own output
    (parent / "metrics.json").write_text('{"ap": 0.8}')              # the parent reran
    (parent / "own.csv").write_text("a\n2\n")
    assert inputs.take_from_parent("child", "03_clip4dm", "embedded", root=art) == ["metrics.json"]
    assert (child / "metrics.json").read_text() == '{"ap": 0.8}' and (child / "own.csv").read_text() == "a\n1\n"
    assert json.loads((child / inputs.MARKER).read_text())["files"] == ["metrics.json"]
    assert inputs.take_from_parent("child", "03_clip4dm", "embedded", root=art) == []
    assert json.loads((child / inputs.MARKER).read_text())["files"] == ["metrics.json"]     # kept, not emptied


def test_a_child_with_its_own_preset_overlay_inherits_nothing(tmp_path, monkeypatch):
    import os
    from lib import ROOT
    from lib.compendium import presets
    name = f"overlaid-{os.getpid()}"
    prof = ROOT / "params" / f"{name}.yaml"
    prof.write_text("extends: embedded\n")
    try:
        monkeypatch.setattr(presets, "PRESETS_DIR", tmp_path)
        assert "03_clip4dm" in inputs.inherited_stages(name)         # nothing changed: every stage inherited
        (tmp_path / "overlays").mkdir()
        (tmp_path / "overlays" / f"{name}.yaml").write_text("encoders: {}\n")
        assert inputs.inherited_stages(name) == {}
    finally:
        prof.unlink(missing_ok=True)
