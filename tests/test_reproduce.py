"""`make reproduce`'s machinery: stages skipped when their inputs are unchanged, a killed run resumed at
the stage it stopped in, the committed answers exported and replayed, results published and compared,
and `make test`'s check that the working tree is left as it was. Stages are stubbed here (the real ones
run in `make test`'s ci run)."""
from __future__ import annotations

import gzip
import hashlib
import json

import pytest

import lib.compendium.results as results
import lib.compendium.runner as runner
import lib.compendium.stages as stages_mod
from lib.compendium.artifacts import read_json
from lib.models.chat.cache import ResponseCache
from lib.models.chat.messages import ChatResult


def K(name: str) -> str:
    """A cache key (a request's sha256) named for a test's reading."""
    return hashlib.sha256(name.encode()).hexdigest()
from lib.compendium.params import load_profile, stages


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """artifacts/ and results/ in a temp folder; stages recorded instead of run (a stage named in
    `fail` raises, as a killed or failing run does)."""
    monkeypatch.setattr(stages_mod, "ARTIFACTS_ROOT", tmp_path / "artifacts")
    monkeypatch.setattr(results, "ARTIFACTS_ROOT", tmp_path / "artifacts")
    monkeypatch.setattr(results, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr("lib.models.chat.cache.ROOT", tmp_path)
    ran, fail = [], set()

    def fake(stage, profile, params=None, **kw):
        if stage.name in fail:
            raise stages_mod.StageError(f"{stage.name} stopped")
        ran.append(stage.name)
        d = tmp_path / "artifacts" / profile / stage.name
        d.mkdir(parents=True, exist_ok=True)
        (d / "metrics.json").write_text(json.dumps({"acc": 0.5, "wall_s": 3.0}))
    monkeypatch.setattr(stages_mod, "run_notebook", fake)
    monkeypatch.setattr(stages_mod, "check_outputs", lambda *a, **k: None)   # the fakes write no real outputs
    monkeypatch.setattr(stages_mod, "provide_inputs", lambda *a, **k: 0)    # tests/test_inputs.py covers inputs
    monkeypatch.setattr(stages_mod, "run_module", lambda st, p, **kw: fake(st, p))
    return tmp_path, ran, fail


def _run(profile="embedded", force=False, publish=False):
    return stages_mod._run_stages(stages(), profile, load_profile(profile), force=force, publish=publish)


def test_a_second_run_skips_every_up_to_date_stage(sandbox):
    tmp, ran, _ = sandbox
    assert _run() == 0 and ran == [s.name for s in stages()]
    ran.clear()
    assert _run() == 0 and ran == []
    assert _run(force=True) == 0 and len(ran) == len(stages())
    t = read_json(tmp / "artifacts" / "embedded" / "timings.json")
    assert set(t["stages"]) == {s.name for s in stages()} and all(v["cold"] for v in t["stages"].values())
    assert not any(v["cold"] for v in t["last_run"].values())   # the forced rerun found every folder: not cold


def test_a_killed_run_resumes_at_the_stage_it_stopped_in(sandbox):
    tmp, ran, fail = sandbox
    names = [s.name for s in stages()]
    fail.add(names[4])
    assert _run() == 1 and ran == names[:4]
    ran.clear()
    fail.clear()
    assert _run() == 0 and ran == names[4:]


def test_a_stage_reruns_when_its_parameters_or_what_it_used_change():
    from lib.compendium.stamps import Digests, stage_stamp
    st = stages()
    p = load_profile("embedded")
    d = Digests()
    usage = {"modules": {"lib.trace.model": "lib/trace/model.py"}, "opened": ["params/prompts/caption/x.txt"]}
    a = stage_stamp(st[3], p[st[3].name], "embedded", usage, "x", d)
    assert a == stage_stamp(st[3], dict(p[st[3].name]), "embedded", usage, "x", d)
    assert a != stage_stamp(st[3], {**p[st[3].name], "seed": 7}, "embedded", usage, "x", d)
    assert a == stage_stamp(st[3], p[st[3].name], "embedded", usage, "y", d)          # with usage: no chain
    assert a != stage_stamp(st[3], p[st[3].name], "embedded", {**usage, "modules": {}}, "x", d)
    legacy = stage_stamp(st[3], p[st[3].name], "embedded", None, "x", d)                # no record: everything
    assert legacy != stage_stamp(st[3], p[st[3].name], "embedded", None, "y", d)        # an earlier stage changed


def _answer(text):
    return ChatResult(text=text, model="m", usage={"prompt_tokens": 3, "completion_tokens": 2})


def test_answers_used_by_the_last_runs_are_exported_and_replayed(tmp_path, monkeypatch):
    c = ResponseCache(tmp_path / "a.sqlite")
    monkeypatch.setenv("COMPENDIUM_STAGE", "04_few_shot")
    c.put(K("k1"), _answer("hateful"))
    c.put(K("k2"), _answer("not hateful"))
    monkeypatch.setenv("COMPENDIUM_STAGE", "05_debate")
    c.put(K("k3"), _answer("label 3"))
    monkeypatch.delenv("COMPENDIUM_STAGE")
    c.put(K("k4"), _answer("a development answer no stage used"))
    c.clear_used("05_debate")                                   # 05 starts again: its marks are gone until used
    monkeypatch.setenv("COMPENDIUM_STAGE", "05_debate")
    assert c.get(K("k3")).text == "label 3"
    out = tmp_path / "responses.jsonl.gz"
    assert c.export(out) == 3
    rows = [json.loads(x) for x in gzip.open(out, "rt")]
    assert [r["key"] for r in rows] == sorted(K(k) for k in ("k1", "k2", "k3")) and "created" not in rows[0]
    first = out.read_bytes()
    c.export(out)
    assert out.read_bytes() == first                             # the same answers give the same bytes
    fresh = ResponseCache(tmp_path / "b.sqlite")
    assert fresh.import_answers(out) == 3 and fresh.import_answers(out) == 0
    assert fresh.get(K("k2")).text == "not hateful" and fresh.get(K("k4")) is None


def test_answers_of_another_kind_of_machine_are_kept_beside_the_committed_ones(tmp_path, monkeypatch):
    """`make test-answers KEEP=1`: a machine whose CPU trains other weights asks other keys; its answers join
    the committed ones (a key in both keeps the committed line), so either kind of machine replays its own."""
    out = tmp_path / "responses.jsonl.gz"
    monkeypatch.setenv("COMPENDIUM_STAGE", "04_few_shot")
    one = ResponseCache(tmp_path / "one.sqlite")
    one.put(K("k1"), _answer("hateful"))
    one.put(K("k2"), _answer("from the first machine"))
    assert one.export(out) == 2
    other = ResponseCache(tmp_path / "other.sqlite")
    other.put(K("k2"), _answer("the same key, answered again"))
    other.put(K("k9"), _answer("another kind of CPU"))
    assert other.export(out, keep=True) == 3
    both = ResponseCache(tmp_path / "both.sqlite")
    assert both.import_answers(out) == 3
    assert [both.get(K(k)).text for k in ("k1", "k2", "k9")] == ["hateful", "from the first machine", "another kind of CPU"]
    assert other.export(out) == 2                                # without keep: exactly what this machine used


def test_publish_copies_scrubs_and_prunes_and_compares(sandbox, capsys):
    tmp, _, _ = sandbox
    src = tmp / "artifacts" / "embedded" / "05_debate"
    src.mkdir(parents=True)
    (src / "metrics.json").write_text(json.dumps({"acc": 0.5, "calls": 10}))
    (src / "claims.csv").write_text(f"claim,img\nx,{results.ROOT}/artifacts/embedded/a.png\n")
    (src / "results_rerun_check.jsonl").write_text("{}\n")               # a check's own output: never committed
    dest = tmp / "results" / "embedded" / "05_debate"
    dest.mkdir(parents=True)
    (dest / "stale.csv").write_text("old\n")
    (dest / "metrics.json").write_text(json.dumps({"acc": 0.4, "calls": 99}))
    written = results.publish_stage("embedded", "05_debate")
    assert written == ["claims.csv", "metrics.json"]
    assert not (dest / "stale.csv").exists() and not (dest / "results_rerun_check.jsonl").exists()
    assert str(results.ROOT) not in (dest / "claims.csv").read_text()
    out = capsys.readouterr().out
    assert "acc: 0.4 -> 0.5 (differs; no seed spread to judge it by)" in out and "calls" not in out.split("acc")[1]


def test_compare_says_identical_inside_or_outside_the_seed_spread():
    same = results.compare_metrics({"acc": 0.5, "wall_s": 3}, {"acc": 0.5000001, "wall_s": 9})
    assert same[0].startswith("identical") and len(same) == 1
    lines = results.compare_metrics({"m_seed_mean": 0.5, "x": 1}, {"m_seed_mean": 0.52, "x": 2},
                                    {"m_seed_mean": (0.45, 0.55)})
    assert any("inside the committed seed spread" in x for x in lines)
    lines = results.compare_metrics({"m_seed_mean": 0.5}, {"m_seed_mean": 0.7}, {"m_seed_mean": (0.45, 0.55)})
    assert any("OUTSIDE" in x for x in lines)
    nan = float("nan")                                 # undefined in both runs (no hard memes): the same, not a change
    assert results.compare_metrics({"acc_hard": nan}, {"acc_hard": nan})[0].startswith("identical")
    assert len(results.compare_metrics({"acc_hard": nan}, {"acc_hard": 0.5})) == 2


def test_fresh_refuses_a_published_profile_and_a_path(capsys):
    assert runner.main(["reproduce", "--profile", "embedded", "--fresh"]) == 2
    assert "would delete artifacts/embedded/" in capsys.readouterr().err
    assert runner.main(["reproduce", "--profile", "../x", "--fresh"]) == 2
    assert "not a plain name" in capsys.readouterr().err


def test_the_working_tree_check_sees_a_change(tmp_path, monkeypatch):
    import subprocess
    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run(["git", "add", "a.txt"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=x@y", "-c", "user.name=x", "commit", "-qm", "a"], cwd=repo, check=True)
    monkeypatch.setattr(runner, "ROOT", repo)
    before = runner._git_status()
    (repo / "a.txt").write_text("changed\n")
    assert runner._git_status() != before


@pytest.mark.parametrize("stage", ["00_data_prep", "01_captioning", "02_finetuning", "04_few_shot", "05_debate",
                                   "06_evaluation"])
def test_a_missing_results_file_names_it_and_the_command_that_writes_it(tmp_path, stage):
    from lib.evaluation.recompute import MissingResult, recompute
    (tmp_path / stage).mkdir()
    with pytest.raises(MissingResult, match=rf"{stage}/\S+ is missing: `make reproduce NB={stage[:2]}` writes it"):
        recompute(stage, tmp_path / stage, tmp_path)


def test_a_corrupt_results_file_names_it(tmp_path):
    from lib.evaluation.recompute import recompute
    d = tmp_path / "05_debate"
    d.mkdir()
    (d / "settings.json").write_text('{"class_mode": "multiclass", ')
    with pytest.raises(ValueError, match=r"05_debate/settings.json: malformed JSON at line 1"):
        recompute("05_debate", d, tmp_path)


def test_a_run_counts_the_answers_it_loaded_and_the_ones_it_asked_for(sandbox, monkeypatch, capsys):
    """make test's ci run replays the committed ci answers; what it had to ask a model for is counted."""
    import contextlib
    tmp, ran, _ = sandbox
    monkeypatch.setattr(stages_mod, "profile_services", lambda profile: contextlib.nullcontext())
    committed = results.cache_export_path("ci")
    seed = ResponseCache(tmp / "seed.sqlite")
    monkeypatch.setenv("COMPENDIUM_STAGE", "04_few_shot")
    for k in ("k1", "k2", "k3"):
        seed.put(K(k), _answer(k))
    monkeypatch.delenv("COMPENDIUM_STAGE")
    seed.export(committed)

    found = []

    def stage(st, profile, params=None, **kw):          # each stage reads k1 and asks for one answer of its own
        ran.append(st.name)
        (tmp / "artifacts" / profile / st.name).mkdir(parents=True, exist_ok=True)
        c = ResponseCache(stages_mod.default_cache_path(profile))
        found.append(c.get(K("k1")) is not None)
        if c.get(K(f"new-{st.name}")) is None:
            c.put(K(f"new-{st.name}"), _answer("asked"))
    monkeypatch.setattr(stages_mod, "run_notebook", stage)
    monkeypatch.setattr(stages_mod, "run_module", lambda st, p, **kw: stage(st, p))
    assert stages_mod.reproduce("ci", None, publish=False) == 0
    rec = read_json(tmp / "artifacts" / "ci" / "timings.json")["answers"]
    assert rec == {"loaded": 3, "asked": len(stages())} and all(found)
    assert "model answers: %d asked afresh" % len(stages()) in capsys.readouterr().out
    assert stages_mod.reproduce("ci", "05", force=True, publish=False) == 0   # one stage: kept apart, the full run's stays
    t = read_json(tmp / "artifacts" / "ci" / "timings.json")
    assert t["answers_partial"] == {"loaded": 0, "asked": 0} and t["answers"] == rec
    assert stages_mod.reproduce("ci", None, force=True, publish=False) == 0      # a rerun replays everything
    assert read_json(tmp / "artifacts" / "ci" / "timings.json")["answers"] == {"loaded": 0, "asked": 0}
    assert stages_mod.export_answers("ci") == 0                                  # what the runs used, k2/k3 dropped
    keys = [json.loads(x)["key"] for x in gzip.open(committed, "rt")]
    assert K("k1") in keys and K("k2") not in keys and len(keys) == 1 + len(stages())
    found.clear()
    assert stages_mod.reproduce("ci", None, force=True, cold=True, publish=False) == 0   # COLD=1: nothing loaded
    assert read_json(tmp / "artifacts" / "ci" / "timings.json")["answers"] == {"loaded": 0, "asked": len(stages())}
    assert not any(found)


def test_a_stage_that_reuses_cached_answers_is_not_timed_from_nothing(sandbox, monkeypatch):
    """timings.json's `stages` is each stage's cost from nothing: a first run of a stage that replays an answer
    an earlier run asked (its folder new, its answers not) is a latest-run time only."""
    tmp, ran, _ = sandbox
    cache = ResponseCache(stages_mod.default_cache_path("embedded"))
    cache.put(K("old"), _answer("asked before"))

    def stage(st, profile, params=None, **kw):
        ran.append(st.name)
        (tmp / "artifacts" / profile / st.name).mkdir(parents=True, exist_ok=True)
        c = ResponseCache(stages_mod.default_cache_path(profile))
        if st.name == "05_debate":
            assert c.get(K("old")) is not None                    # reused
        elif c.get(K(f"new-{st.name}")) is None:
            c.put(K(f"new-{st.name}"), _answer("asked"))          # asked in this run
    monkeypatch.setattr(stages_mod, "run_notebook", stage)
    monkeypatch.setattr(stages_mod, "run_module", lambda st, p, **kw: stage(st, p))
    assert _run() == 0
    t = read_json(tmp / "artifacts" / "embedded" / "timings.json")
    assert "05_debate" not in t["stages"] and "05_debate" in t["last_run"]
    assert set(t["stages"]) == {s.name for s in stages()} - {"05_debate"}
    assert set(t["replayed"]) == {"05_debate"}              # its folder was new: a fresh clone's time for it
    dest = results.timings_path("embedded")                  # the README's table says so
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(t))
    block = results.timings_block("embedded")
    assert "05_debate not yet" in block and "| from nothing |" in block and "not measured" in block
    assert "| fresh clone (trained here, committed answers replayed) |" in block
    assert _run(force=True) == 0                             # a rerun on its own folders: a latest-run time only
    t2 = read_json(tmp / "artifacts" / "embedded" / "timings.json")
    assert t2["replayed"] == t["replayed"] and t2["stages"] == t["stages"]


def test_make_test_replays_the_ci_answers_unless_cold():
    lanes = runner.make_test_commands(["py"])
    ci = lanes[0][0][1]
    assert ci[-3:] == ["ci", "--force", "--fresh"] and "--cold" not in ci
    assert runner.make_test_commands(["py"], cold=True)[0][0][1][-1] == "--cold"
    assert [n for n, _ in lanes[1]][0] == "unit tests" and lanes[1][1][1][-1] == "paper-smoke"
    # in the ci run's lane, after it: the kills and resumes, the checks of what it wrote; every unit test, then
    # paper-smoke and the committed results' checks in the other lane
    assert [c[1][-1] for c in lanes[0][1:]] == ["ci_resume", "ci_run and not ci_resume"]
    assert lanes[1][0][1][-1] == "not results and not ci_run and not gpu" and lanes[1][-1][1][-1] == "results"
    assert [n for n, _ in runner.make_test_commands(["py"], skip_unit=True)[1]] == ["profile paper-smoke",
                                                                                   "committed results"]
    assert runner.main(["answers", "--profile", "../x"]) == 2


@pytest.mark.parametrize("profile, model", [("ci", "SmolLM2"), ("paper-smoke", "internvl3.5-8b")])
def test_the_committed_test_answers_load_and_hold_the_slow_models_answers(tmp_path, profile, model):
    """make test replays results/<profile>/cache/ for its ci and paper-smoke runs: each must load and hold the
    answers of the models that generate slowly (the served LLM; the paper's VLMs' stand-ins)."""
    f = results.cache_export_path(profile)
    assert f.exists(), f"{f} is missing: `make test-answers` writes it"
    c = ResponseCache(tmp_path / "r.sqlite")
    assert c.import_answers(f) > 0
    models = {json.loads(x)["model"] for x in gzip.open(f, "rt")}
    assert any(model in m for m in models) and not any(m.startswith("/") for m in models)


def test_a_replayed_answer_reads_back_exactly_as_it_was_given(tmp_path, monkeypatch):
    """A parsed answer keeps its keys' order through export and import: the debate's judge reads the
    debaters' parsed answers, so a reordered one would build another prompt than the one first asked,
    and every replay from the committed answers would ask the judge afresh."""
    monkeypatch.setenv("COMPENDIUM_STAGE", "05_debate")
    c = ResponseCache(tmp_path / "a.sqlite")
    parsed = {"rebuttals": [{"id": 1, "evidence": "e", "rebuttal": "r"}], "another": 2}
    c.put(K("k"), ChatResult(json.dumps(parsed), model="m", parsed=parsed))
    out = tmp_path / "responses.jsonl.gz"
    c.export(out)
    fresh = ResponseCache(tmp_path / "b.sqlite")
    fresh.import_answers(out)
    again = fresh.get(K("k")).parsed
    assert again == parsed and json.dumps(again) == json.dumps(parsed)       # same keys in the same order
    assert json.dumps(again) != json.dumps(parsed, sort_keys=True)            # (an order sorting would change)


def test_a_run_of_some_stages_keeps_the_other_stages_committed_answers(sandbox, monkeypatch):
    """A fresh clone's `make reproduce NB=02` marks only its own stage's answers as used: publishing must not
    drop the committed answers of the stages it did not run; a run of every stage writes exactly what it used."""
    import contextlib
    tmp, ran, _ = sandbox
    monkeypatch.setattr(stages_mod, "profile_services", lambda profile: contextlib.nullcontext())
    monkeypatch.setattr(stages_mod, "update_readme", lambda path: None)
    monkeypatch.setattr(results, "ROOT", tmp)                   # publish_run prints paths relative to the root
    committed = results.cache_export_path("embedded")
    seed = ResponseCache(tmp / "seed.sqlite")
    monkeypatch.setenv("COMPENDIUM_STAGE", "04_few_shot")
    seed.put(K("k-other-stage"), _answer("an answer 04 used"))
    monkeypatch.delenv("COMPENDIUM_STAGE")
    seed.export(committed)

    def stage(st, profile, params=None, **kw):          # each stage asks one answer of its own
        ran.append(st.name)
        (tmp / "artifacts" / profile / st.name).mkdir(parents=True, exist_ok=True)
        c = ResponseCache(stages_mod.default_cache_path(profile))
        if c.get(K(f"new-{st.name}")) is None:
            c.put(K(f"new-{st.name}"), _answer("asked"))
    monkeypatch.setattr(stages_mod, "run_notebook", stage)
    monkeypatch.setattr(stages_mod, "run_module", lambda st, p, **kw: stage(st, p))
    monkeypatch.setattr(results, "publish_stage", lambda profile, name: [])
    results.timings_path("embedded").write_text(json.dumps({"stages": {"04_few_shot": {"wall_s": 60.0, "cold": True}}}))
    assert stages_mod.reproduce("embedded", "02", publish=True) == 0
    keys = {json.loads(x)["key"] for x in gzip.open(committed, "rt")}
    assert keys == {K("k-other-stage"), K("new-02_finetuning")}
    t = read_json(results.timings_path("embedded"))
    assert set(t["stages"]) == {"04_few_shot", "02_finetuning"} and "last_run" not in t   # no latest-run times committed
    # a --no-publish run records its times in artifacts/ only: a later published run does not carry them over
    assert stages_mod.reproduce("embedded", "03", publish=False) == 0
    assert "03_clip4dm" in read_json(tmp / "artifacts" / "embedded" / "timings.json")["stages"]
    before = results.timings_path("embedded").read_bytes()
    assert stages_mod.reproduce("embedded", "02", force=True, publish=True) == 0    # warm: measured nothing new
    assert results.timings_path("embedded").read_bytes() == before                  # so timings.json is as it was
    assert "03_clip4dm" not in read_json(results.timings_path("embedded"))["stages"]
    assert stages_mod.reproduce("embedded", None, force=True, publish=True) == 0
    keys = {json.loads(x)["key"] for x in gzip.open(committed, "rt")}
    assert K("k-other-stage") not in keys and len(keys) == len(stages())


def test_a_result_kept_because_only_its_times_moved_is_what_later_stages_read(sandbox):
    """A rerun whose metrics differ from the committed ones only in times keeps the committed file (tracked files do
    not move), and writes it back over the run's copy in artifacts/: later stages (07's throughput figure is drawn
    from times) read the committed bytes, as a fresh clone's `make reproduce NB=07` does. A result that moved is
    published and left as the run wrote it; a file with an absolute path in it is never rewritten from results."""
    tmp, _, _ = sandbox
    art = tmp / "artifacts" / "embedded" / "serving"
    com = tmp / "results" / "embedded" / "serving"
    art.mkdir(parents=True)
    com.mkdir(parents=True)
    (com / "metrics.json").write_text(json.dumps({"answers": 8, "tokens_per_s_served_c1": 88.9}))
    (art / "metrics.json").write_text(json.dumps({"answers": 8, "tokens_per_s_served_c1": 93.1}))
    (com / "details.json").write_text(json.dumps({"answers": 8}))
    (art / "details.json").write_text(json.dumps({"answers": 9}))                      # a result moved
    (com / "settings.json").write_text(json.dumps({"dir": "models/x", "wall_s": 1.0}))
    (art / "settings.json").write_text(json.dumps({"dir": f"{stages_mod.ROOT}/models/x", "wall_s": 2.0}))
    committed = (com / "metrics.json").read_bytes()
    results.publish_stage("embedded", "serving")
    assert (com / "metrics.json").read_bytes() == committed                   # only a time moved: committed stays
    assert stages_mod.keep_committed("embedded", "serving") == ["metrics.json"]
    assert (art / "metrics.json").read_bytes() == committed                   # and later stages read it
    assert json.loads((art / "details.json").read_text()) == {"answers": 9} == json.loads((com / "details.json").read_text())
    assert str(stages_mod.ROOT) in (art / "settings.json").read_text()        # an absolute path: not rewritten
    assert stages_mod.keep_committed("embedded", "serving") == []              # nothing left to keep
    # a cache key or code digest that moved is not a time: the committed copy is kept in results/, but the run's
    # copy stays in artifacts/ (else a model stage would find its old key and retrain on every run)
    (com / "metrics.json").write_text(json.dumps({"answers": 8, "cache_key": "k1", "wall_s": 1.0}))
    (art / "metrics.json").write_text(json.dumps({"answers": 8, "cache_key": "k2", "wall_s": 2.0}))
    results.publish_stage("embedded", "serving")
    assert json.loads((com / "metrics.json").read_text())["cache_key"] == "k1"
    assert stages_mod.keep_committed("embedded", "serving") == []
    assert json.loads((art / "metrics.json").read_text())["cache_key"] == "k2"


def test_a_full_rerun_whose_times_alone_moved_writes_the_committed_bytes_back_and_leaves_nothing_stale(sandbox,
                                                                                                       monkeypatch):
    """The write-back through the runner itself: a published run, then a forced rerun of every stage whose metrics
    differ only in their times. results/ keeps the committed files, artifacts/ then holds the committed bytes (what
    later stages and a fresh clone read), and a third run finds every stage up to date."""
    import contextlib
    tmp, ran, _ = sandbox
    monkeypatch.setattr(stages_mod, "profile_services", lambda profile: contextlib.nullcontext())
    monkeypatch.setattr(stages_mod, "update_readme", lambda path: None)
    monkeypatch.setattr(results, "ROOT", tmp)
    runs = []

    def stage(st, profile, params=None, **kw):          # the same result each run, another time
        ran.append(st.name)
        d = tmp / "artifacts" / profile / st.name
        d.mkdir(parents=True, exist_ok=True)
        (d / "metrics.json").write_text(json.dumps({"acc": 0.5, "wall_s": 3.0 + len(runs)}))
    monkeypatch.setattr(stages_mod, "run_notebook", stage)
    monkeypatch.setattr(stages_mod, "run_module", lambda st, p, **kw: stage(st, p))
    names = [s.name for s in stages()]
    assert _run(publish=True) == 0 and ran == names
    committed = {n: f.read_bytes() for n in names if (f := tmp / "results" / "embedded" / n / "metrics.json").exists()}
    assert len(committed) >= len(names) - 1              # 07 publishes figures, not metrics
    runs.append(1)
    ran.clear()
    assert _run(force=True, publish=True) == 0 and ran == names
    for n in committed:
        assert (tmp / "results" / "embedded" / n / "metrics.json").read_bytes() == committed[n], n
        assert (tmp / "artifacts" / "embedded" / n / "metrics.json").read_bytes() == committed[n], n
    ran.clear()
    assert _run(publish=True) == 0 and ran == []
