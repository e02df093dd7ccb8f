"""The harness: notebook scrubbing, README results, environment files, CI entry point."""
import json
import os

import nbformat

from lib import ROOT
from lib.compendium import findings, stages as st
from lib.compendium.stages import scrub_notebook


def _nb_with_outputs(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["papermill"] = {"start_time": "2026-01-01T00:00:00", "end_time": "x", "duration": 1.0,
                                "input_path": str(ROOT / "notebooks/x.ipynb"), "parameters": {"a": 1}}
    c = nbformat.v4.new_code_cell("print(1)")
    c.metadata["papermill"] = {"start_time": "t", "duration": 2}
    c.metadata["execution"] = {"iopub.execute_input": "t"}
    c.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=f"saved {ROOT}/figures/a.png key=FAKE-SECRET-SECRET\n"),
        nbformat.v4.new_output("stream", name="stderr", text="load: 100%|██████████| 13/13 [00:01<00:00, 9.1it/s]"),
        nbformat.v4.new_output("stream", name="stderr", text="a real warning\n"),
        nbformat.v4.new_output("stream", name="stderr", text="\n"),
    ]
    nb.cells.append(c)
    p = tmp_path / "x.ipynb"
    nbformat.write(nb, str(p))
    return p


def test_scrub_removes_timestamps_paths_progress_and_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "FAKE-SECRET-SECRET")
    p = _nb_with_outputs(tmp_path)
    scrub_notebook(p)
    text = p.read_text()
    nb = json.loads(text)
    assert "start_time" not in text and "duration" not in text and "iopub" not in text
    assert str(ROOT) not in text and "FAKE-SECRET-SECRET" not in text
    outs = [("".join(o["text"])) for o in nb["cells"][0]["outputs"]]
    assert outs == ["saved figures/a.png key=***\n", "a real warning\n"]
    assert nb["metadata"]["papermill"]["input_path"] == "notebooks/x.ipynb"


def test_scrub_redacts_keys_from_dotenv_and_paths_outside_the_project(tmp_path, monkeypatch):
    import lib.compendium.stages as stages
    from lib.models.chat import read_dotenv
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setattr("lib.compendium.scrub.read_dotenv", lambda p: {**read_dotenv(p), "GEMINI_API_KEY": "fake-dotenv-only-123",
                                                           "DASHSCOPE_API_KEY_2": "fake-rotated-second-key"})
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("x")
    c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        "key fake-dotenv-only-123 and fake-rotated-second-key\n"
        "File /opt/conda/lib/python3.11/site-packages/x.py, tmp '/tmp/pytest-1/cache.sqlite'\n"
        "url http://127.0.0.1:8089/v1 and figures/embedded/a.png, 12/16 posts, 200 tokens/s\n"
        "preset model {artifacts}/embedded/models/m\n")),
        nbformat.v4.new_output("execute_result", data={"text/plain": "PosixPath('/var/tmp/run/out.json')"},
                               execution_count=1)]
    nb.cells.append(c)
    p = tmp_path / "y.ipynb"
    nbformat.write(nb, str(p))
    stages.scrub_notebook(p)
    out = json.loads(p.read_text())["cells"][0]["outputs"]
    text = "".join(out[0]["text"])
    assert "fake-dotenv-only-123" not in text and "fake-rotated-second-key" not in text
    assert "/opt/conda" not in text and "/tmp/pytest-1" not in text and "<abs>/x.py" in text
    assert "http://127.0.0.1:8089/v1" in text and "figures/embedded/a.png" in text and "12/16 posts" in text
    assert "{artifacts}/embedded/models/m" in text
    assert "".join(out[1]["data"]["text/plain"]) == "PosixPath('<abs>/out.json')"


def test_committed_notebooks_carry_no_machine_paths_or_timestamps():
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        text = nb.read_text()
        assert str(ROOT) not in text and os.path.expanduser("~") + "/" not in text, nb.name
        assert '"start_time"' not in text and '"end_time"' not in text, nb.name


def test_environment_yml_is_generated_from_pyproject():
    from lib.compendium.envfiles import dependencies, environment_yml
    assert (ROOT / "environment.yml").read_text() == environment_yml(), "run `make environment.yml`"
    deps = dependencies()
    assert "torch==2.14.1" in deps and "torchvision==0.29.1" in deps


def test_lock_pins_every_declared_dependency():
    lock = {l.split("==")[0].lower().replace("_", "-") for l in (ROOT / "requirements.lock").read_text().splitlines()
            if "==" in l}
    from lib.compendium.envfiles import dependencies
    missing = [d for d in dependencies() if d.split("==")[0].lower().replace("_", "-") not in lock]
    assert not missing, missing


def test_ci_runs_make_test():
    script = (ROOT / ".ci" / "run").read_text()
    assert "make test" in script and os.access(ROOT / ".ci" / "run", os.X_OK)


def test_generated_blocks_are_filled_from_the_results_and_the_rest_is_kept(tmp_path, monkeypatch):
    """`make results` replaces only what sits between a block's markers, with what its function returns for
    the embedded profile; a document without the markers, and a second run, change nothing."""
    from lib.compendium import results
    readme, other = tmp_path / "README.md", tmp_path / "other.md"
    readme.write_text("intro\n<!-- findings:start -->\nold 0.5\n<!-- findings:end -->\nkept\n"
                      "<!-- timings:start --><!-- timings:end -->\nend\n")
    other.write_text("no markers here\n")
    monkeypatch.setattr(results, "BLOCKS", {readme: {"findings": lambda p: f"| {p} | 0.91 |\n",
                                                     "timings": lambda p: "12 min"},
                                            other: {"findings": lambda p: "never written"}})
    monkeypatch.setattr(results, "DOCS_RESULTS", tmp_path / "results.md")
    monkeypatch.setattr(results, "results_page", lambda: "# page\n")
    monkeypatch.setattr(results, "update_notebook_headers", lambda: False)
    assert results.update_readme(readme)
    assert readme.read_text() == ("intro\n<!-- findings:start -->\n| embedded | 0.91 |\n<!-- findings:end -->\nkept\n"
                                  "<!-- timings:start -->\n12 min\n<!-- timings:end -->\nend\n")
    assert other.read_text() == "no markers here\n" and (tmp_path / "results.md").read_text() == "# page\n"
    assert not results.update_readme(readme)


def test_failing_stage_keeps_notebook_and_parks_the_failed_run(tmp_path):
    import shutil

    import pytest

    from lib.compendium.params import Stage
    from lib.compendium.stages import StageError, run_notebook
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell('profile = "embedded"\nroot = "x"')
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, nbformat.v4.new_code_cell("raise FileNotFoundError(f'missing {root}')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src = tmp_path / "09_fail.ipynb"
    nbformat.write(nb, str(src))
    before = src.read_text()
    profile = "pytest-failing-stage"
    try:
        with pytest.raises(StageError) as e:
            run_notebook(Stage("09_fail", notebook=src), profile, {"root": "data/fhm"})
        assert "FileNotFoundError: missing data/fhm" in str(e.value)
        failed = ROOT / "artifacts" / profile / "notebooks" / "FAILED_09_fail.ipynb"
        assert failed.exists() and src.read_text() == before
        assert not list(tmp_path.glob(".*running*"))
    finally:
        shutil.rmtree(ROOT / "artifacts" / profile, ignore_errors=True)


def test_scrub_redacts_keys_read_from_another_env_file(tmp_path, monkeypatch):
    """A key loaded from an env file other than the project's .env (load_chat(..., env_file=...))
    is redacted from saved notebooks too, although the scrubber runs in another process."""
    import lib.models.chat as chat
    from lib.models.chat import api_keys
    env = tmp_path / "elsewhere" / "keys.env"
    env.parent.mkdir()
    env.write_text("export MY_PROVIDER_API_KEY=fake-from-another-env-file-42\nOTHER_TOKEN='fake-token-elsewhere-777'\n")
    monkeypatch.delenv("MY_PROVIDER_API_KEY", raising=False)
    assert api_keys("MY_PROVIDER_API_KEY", env_file=env) == ["fake-from-another-env-file-42"]
    assert env.resolve() in chat.remembered_env_files()
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("x")
    c.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                        text="sent fake-from-another-env-file-42 and fake-token-elsewhere-777\n")]
    nb.cells.append(c)
    p = tmp_path / "z.ipynb"
    nbformat.write(nb, str(p))
    scrub_notebook(p)
    text = p.read_text()
    assert "fake-from-another-env-file-42" not in text and "fake-token-elsewhere-777" not in text and "sent *** and ***" in text


def test_the_findings_block_gives_each_planned_claim_its_effect_and_verdict_and_the_page_every_column(tmp_path, monkeypatch,
                                                                                                    plan_at):
    """The README's block, from the committed claims tables and the analysis plan: one row per primary claim of the
    plan (claim, effect with interval, verdict), the legend from the verdict rules; a claim whose table has no row
    reads "not run"; the whole table (test, raw and Holm-adjusted p, design MDD, control, baseline) on its page."""
    from lib.arcade.report import claim_frame
    from lib.compendium import results
    from lib.evaluation import plan as analysis
    from lib.evaluation.verdicts import legend
    from tests.test_debate_oracle import _runs
    plan_at(96)
    (tmp_path / "05_debate").mkdir()
    claim_frame(_runs({"arcade": 0.90, "direct": 0.40, "oracle": 0.95})).to_csv(tmp_path / "05_debate" / "claims.csv",
                                                                               index=False)
    monkeypatch.setattr("lib.compendium.findings.results_dir", lambda profile: tmp_path)
    plan = analysis.load()
    block = results.findings_block("embedded")
    lines = [ln for ln in block.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert lines[0] == "| system | claim | A − B [95% CI] | verdict |"
    assert len(lines) == 1 + sum(c.role == "primary" for c in plan.claims)
    rows = {ln.split(" | ")[1]: ln.split(" | ") for ln in lines[1:]}
    assert rows["debate beats a direct judge"][-1].rstrip(" |") == "reproduced"       # +0.50 at p ~ 1e-14
    assert rows["captions help"][-1].rstrip(" |") == "not run"                       # 02 wrote no claims table
    assert legend() in block
    frame = findings.findings_rows("embedded")
    debate = next(r for r in frame if r["id"] == "arcade.debate_vs_direct")
    assert float(debate["p adjusted"]) >= float(debate["p"]) and debate["control"].startswith("oracle vs direct: +0.5")
    page = findings.findings_page("embedded")
    assert plan.digest in page and "p (Holm)" in page and "design MDD (80%, alpha/m)" in page


def test_the_time_left_falls_back_to_fresh_clone_and_latest_times_and_names_what_it_cannot_estimate(tmp_path, monkeypatch):
    """A stage never run from nothing still gets an estimate (a fresh clone's time, else the latest run's),
    the words say which record it rests on, a COLD=1 run prefers the time from nothing, this machine's
    record wins over the committed one, and a stage with no record is named, not counted as zero."""
    committed, local = tmp_path / "results" / "timings.json", tmp_path / "artifacts" / "embedded" / "timings.json"
    committed.parent.mkdir(parents=True)
    local.parent.mkdir(parents=True)
    committed.write_text(json.dumps({
        "stages": {"02": {"wall_s": 600.0}, "05": {"wall_s": 9000.0}},
        "replayed": {"05": {"wall_s": 4200.0}},
        "last_run": {"04": {"wall_s": 5700.0}, "05": {"wall_s": 34.0}, "06": {"wall_s": "broken"}}}))
    local.write_text(json.dumps({"replayed": {"05": {"wall_s": 4500.0}}}))
    monkeypatch.setattr(st.results, "timings_path", lambda profile: committed)
    from lib.compendium import timekeeping
    monkeypatch.setattr(timekeeping, "ARTIFACTS_ROOT", tmp_path / "artifacts")

    est = st.estimates("embedded")
    assert est["02"] == (600.0, "from nothing")
    assert est["04"] == (5700.0, "latest run")
    assert est["05"] == (4500.0, "fresh clone")          # replayed beats from nothing; this machine beats committed
    assert "06" not in est                              # an unreadable time is no estimate
    assert st.estimates("embedded", cold=True)["05"] == (9000.0, "from nothing")

    assert st.time_left(["04", "05"], est) == "about 170.0 min left in this run"
    assert st.time_left(["05", "06", "07"], est) == "about 75.0 min left in this run, besides 06, 07 (no time recorded)"
    assert "cannot be estimated" in st.time_left(["06"], est)

    local.write_text("{not json")                       # a damaged local record costs only its own rows
    assert st.estimates("embedded")["05"] == (4200.0, "fresh clone")


def test_a_notebooks_cost_cell_gives_its_fresh_clone_time(tmp_path, monkeypatch):
    """The cost cell of a stage never timed from nothing still gives what a fresh clone's run costs (its models
    trained here, the committed answers replayed); the latest run's time is no committed fact (it moves with every
    rerun) and is never shown; one with no record says so."""
    from lib.compendium import results
    f = tmp_path / "timings.json"
    f.write_text(json.dumps({"machine": "Linux x86_64, 2 CPU cores (AMD EPYC)",
                             "stages": {"02_finetuning": {"wall_s": 2841.5}},
                             "replayed": {"05_debate": {"wall_s": 3538.7}},
                             "last_run": {"05_debate": {"wall_s": 38.7}, "02_finetuning": {"wall_s": 74.1}}}))
    monkeypatch.setattr(results, "timings_path", lambda profile: f)
    five = results.notebook_cost("05_debate")
    assert "not yet timed from nothing on 2 CPU cores" in five and "59.0 min from a fresh clone" in five
    assert "latest run" not in five and "39 s" not in five
    two = results.notebook_cost("02_finetuning")
    assert two.startswith("embedded: 47.4 min on 2 CPU cores from nothing") and "fresh clone" not in two
    assert "embedded" not in results.notebook_cost("06_evaluation")


def test_the_timings_block_says_whether_a_fresh_clone_fits_the_budget(tmp_path, monkeypatch):
    """Once every stage has a fresh-clone time (replayed, else from nothing) the README's sentence gives
    the total against the budget, inside or over; until then it names the stages without one."""
    from lib.compendium import results
    from lib.compendium.params import stages
    names = [s.name for s in stages()]
    f = tmp_path / "timings.json"
    monkeypatch.setattr(results, "timings_path", lambda profile: f)

    def block(stage_s, replayed):
        f.write_text(json.dumps({"machine": "Linux x86_64, 2 CPU cores (AMD EPYC)",
                                 "stages": {n: {"wall_s": stage_s, "cold": True} for n in names[:-1]},
                                 "replayed": replayed, "last_run": {n: {"wall_s": 1.0} for n in names}}))
        return results.timings_block("embedded")

    part = block(60.0, {names[1]: {"wall_s": 30.0}})
    assert f"({names[-1]} not yet)" in part and "every stage measured" not in part
    share = results.BUDGET_S / len(names)
    inside = block(share - 1, {names[-1]: {"wall_s": share - 1}})
    assert "every stage measured: inside the budget" in inside and f"{names[-1]} not yet)" not in inside
    over = block(share + 1, {names[-1]: {"wall_s": share + 1}})
    assert "every stage measured: over the budget" in over


def test_a_time_measured_at_earlier_parameters_is_marked_so(tmp_path, monkeypatch):
    """Each recorded time carries the digest of its stage's parameters; once the profile's section changes (an
    evaluation set grown), the README's timings and the notebook's cost cell mark that time as measured at the
    stage's earlier parameters, and a time at the current ones stays unmarked."""
    from lib.compendium import results
    from lib.compendium import stages as st
    from lib.compendium.params import load_profile, section_digest, stages
    names = [s.name for s in stages()]
    sections = load_profile("embedded")
    now = {n: section_digest(sections[n]) for n in names}
    assert len(set(now.values())) == len(names)          # the digest tells the stages' sections apart
    grown = dict(sections[names[-1]], eval_n=10 ** 6)
    assert section_digest(grown) != now[names[-1]]
    row = st.record_timing({}, names[-1], 12.0, cold=False, fresh=True, params=now[names[-1]])
    assert row["replayed"][names[-1]]["params"] == row["last_run"][names[-1]]["params"] == now[names[-1]]

    f = tmp_path / "timings.json"
    monkeypatch.setattr(results, "timings_path", lambda profile: f)
    t = {"machine": "Linux x86_64, 2 CPU cores (AMD EPYC)",
         "stages": {n: {"wall_s": 60.0, "cold": True, "params": now[n]} for n in names[:-1]},
         "replayed": {names[-1]: {"wall_s": 90.0, "params": "0" * 12}},
         "last_run": {n: {"wall_s": 1.0, "params": now[n]} for n in names}}
    f.write_text(json.dumps(t))
    block = results.timings_block("embedded")
    assert f"({names[-1]} timed at its earlier parameters{results.EARLIER})" in block
    assert f"1.5 min{results.EARLIER} |" in block and block.count(results.EARLIER) == 3   # sentence, cell, note
    assert "measured at that stage's earlier parameters" in block
    assert "at this stage's earlier parameters" in results.notebook_cost(names[-1], "embedded")
    assert "earlier parameters" not in results.notebook_cost(names[0], "embedded")

    t["replayed"][names[-1]]["params"] = now[names[-1]]     # re-timed at the current parameters: nothing marked
    f.write_text(json.dumps(t))
    assert results.EARLIER not in results.timings_block("embedded")
    del t["replayed"][names[-1]]["params"]                  # a time recorded before digests: taken as current
    f.write_text(json.dumps(t))
    assert results.EARLIER not in results.timings_block("embedded")


def test_only_the_reference_profile_is_checked_by_nbval():
    """The recorded outputs (tests/reference/ci_checked_outputs.json) are the ci profile's: a profile extending ci
    inherits its runner section but changes sizes or variants on purpose, so it runs under papermill."""
    from lib.compendium.execution import REFERENCE_PROFILE, executor_for
    assert executor_for(REFERENCE_PROFILE, "nbval") == "nbval"
    assert executor_for("ablation-x", "nbval") == "papermill"
    assert executor_for("embedded", "papermill") == executor_for(REFERENCE_PROFILE, "papermill") == "papermill"


def test_every_checked_cell_has_a_recorded_output_for_its_current_source():
    """The unit lane's early warning for nbval (the ci run would fail on it twenty minutes later): a notebook cell
    marked NBVAL_CHECK_OUTPUT that was edited, added or removed without `python -m lib.compendium.nbcheck --write`
    after a ci run."""
    from lib.compendium.nbcheck import unrecorded
    assert unrecorded() == []
