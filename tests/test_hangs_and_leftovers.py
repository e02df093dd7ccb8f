"""No run can hang without a timeout error, and none leaves a process behind: a cell past its limit and a stage past
its limit fail naming the notebook, the cell and the time; a run that fails, or is stopped with SIGINT or SIGTERM,
ends every process it started (the kernel starts a session of its own, so a process group alone would miss it);
after a SIGKILL of the runner itself, the next run ends what the killed one left."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import nbformat
import pytest

from lib import ROOT
from lib.compendium import procs
from lib.compendium.execution import Limits, stage_limits
from lib.compendium.params import RunnerConfig, Stage
from lib.compendium.stages import StageError, StageTimeout, _run_one, run_notebook

#: a child that starts a session of its own (as the Jupyter kernel does) and a grandchild, both asleep
SLEEPERS = ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\"]); time.sleep(600)'], "
            "start_new_session=True)\n")


def _notebook(tmp_path, *cells, name="09_t.ipynb"):
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell('profile = "embedded"\nx = 1')
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p] + [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src = tmp_path / name
    nbformat.write(nb, str(src))
    return Stage(src.stem, notebook=src)


@pytest.fixture
def profile():
    import shutil
    name = f"pytest-hang-{uuid.uuid4().hex[:6]}"
    yield name
    shutil.rmtree(ROOT / "artifacts" / name, ignore_errors=True)


@pytest.fixture
def mark():
    """A run id of this test's own: every process started inside carries it, so what is left can be counted."""
    run_id = f"pytest-{uuid.uuid4().hex[:8]}"
    with procs.tagged(run_id):
        yield run_id
    procs.end_processes(run_id)


@pytest.mark.parametrize("executor", ["papermill", "nbval"])
def test_a_cell_past_its_limit_fails_naming_the_notebook_the_cell_and_the_time(tmp_path, profile, mark, executor):
    st = _notebook(tmp_path, "print('fast')", "import time; time.sleep(60)", "print('never')")
    t0 = time.time()
    with pytest.raises(StageError) as e:
        run_notebook(st, profile, {"x": 2}, limits=Limits(3, 100, "the test's cell limit", "-"), executor=executor)
    msg = str(e.value)
    assert time.time() - t0 < 45
    assert "09_t.ipynb" in msg and "cell 3 ('import time; time.sleep(60)')" in msg and "timeout of 3 s (the test's cell limit)" in msg, msg
    assert not procs.processes_of(mark)


def test_a_stage_past_its_limit_fails_naming_the_stage_the_cell_and_the_time(tmp_path, profile, mark):
    """The stage's own limit, over cells each inside theirs: its watchdog ends the kernel and every process the
    stage started (here a sleeper in a session of its own), and the error says where the stage was."""
    st = _notebook(tmp_path, SLEEPERS, "import time\nfor _ in range(60):\n    time.sleep(1)")
    t0 = time.time()
    with pytest.raises(StageTimeout) as e:
        _run_one(st, profile, {"x": 2}, Limits(100, 6, "-", "the test's stage limit"), "papermill")
    msg = str(e.value)
    assert time.time() - t0 < 45
    assert "ran past its stage timeout of 6 s (the test's stage limit) in cell 3 ('import time')" in msg, msg
    assert "every process it started was ended" in msg
    assert not procs.processes_of(mark)


def test_a_failed_stage_ends_what_it_started(tmp_path, profile, mark):
    st = _notebook(tmp_path, SLEEPERS, "raise RuntimeError('boom')")
    with pytest.raises(StageError, match="RuntimeError: boom"):
        _run_one(st, profile, {"x": 2}, Limits(100, 100, "-", "-"), "papermill")
    assert not procs.processes_of(mark)


def test_limits_come_from_the_recorded_times_with_a_floor(monkeypatch, tmp_path):
    import json
    from lib.compendium import execution
    monkeypatch.setattr(execution, "ARTIFACTS_ROOT", tmp_path / "artifacts")
    monkeypatch.setattr(execution, "RESULTS_ROOT", tmp_path / "results")
    f = tmp_path / "results" / "embedded" / "timings.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"stages": {"02_finetuning": {"wall_s": 3000.0, "slowest_cell_s": 500.0}},
                             "last_run": {"02_finetuning": {"wall_s": 70.0}, "07_figures": {"wall_s": 30.0}}}))
    cfg = RunnerConfig()
    lim = stage_limits("embedded", "02_finetuning", cfg)
    assert (lim.stage_s, lim.cell_s) == (12000.0, 2000.0) and "3000 s" in lim.stage_why and "500 s" in lim.cell_why
    lim = stage_limits("embedded", "07_figures", cfg)            # 4 x 30 s is under the floors
    assert (lim.stage_s, lim.cell_s) == (1800.0, 1800.0) and "floor 1800 s" in lim.stage_why
    assert stage_limits("embedded", "05_debate", cfg).stage_s == cfg.unrecorded_stage_s      # nothing recorded
    lim = stage_limits("ci", "02_finetuning", cfg)                # ci extends embedded: its parent's record
    assert lim.stage_s == 12000.0 and "profile embedded, which ci extends" in lim.stage_why
    lim = stage_limits("ci", "02_finetuning", RunnerConfig(cell_timeout_s=60, stage_timeout_s=90))
    assert (lim.cell_s, lim.stage_s) == (60, 90) and "runner.stage_timeout_s" in lim.stage_why
    # a quick rerun that read its work back (a 20 s cell, a 70 s stage, on this machine and in a child profile) does
    # not shrink the limits a retraining run needs: the longest time over the whole chain, cells from runs from nothing
    cells = tmp_path / "artifacts" / "embedded" / "notebooks" / "02_finetuning.cells.json"
    cells.parent.mkdir(parents=True)
    cells.write_text(json.dumps({"cells": [{"seconds": 20.0}]}))
    child = tmp_path / "artifacts" / "ci" / "timings.json"
    child.parent.mkdir(parents=True)
    child.write_text(json.dumps({"last_run": {"02_finetuning": {"wall_s": 70.0, "slowest_cell_s": 20.0}}}))
    for prof in ("embedded", "ci"):
        lim = stage_limits(prof, "02_finetuning", cfg)
        assert (lim.stage_s, lim.cell_s) == (12000.0, 2000.0), prof
    # no cell recorded from nothing: a cell may take the stage's whole limit
    f.write_text(json.dumps({"replayed": {"02_finetuning": {"wall_s": 3000.0, "slowest_cell_s": 5.0}}}))
    lim = stage_limits("embedded", "02_finetuning", cfg)
    assert lim.cell_s == lim.stage_s == 12000.0 and "from nothing" in lim.cell_why


# ----------------------------------------------------------------------------- signals and SIGKILL
RUN = textwrap.dedent("""
    import subprocess, sys, time
    from lib.compendium import procs
    with procs.owned_run("pytest owned run"):
        exec({sleepers!r})
        print("started", flush=True)
        time.sleep(600)
""")


def _start(outer: str) -> subprocess.Popen:
    env = {**os.environ, procs.RUN_IDS_ENV: outer}
    # SIGINT as a terminal delivers it: a shell's background job (`make test &`) inherits SIGINT ignored, and a
    # Python started with it ignored never installs its KeyboardInterrupt handler (rightly: such a run is meant
    # to outlive Ctrl-C), so the run under test restores the default first
    p = subprocess.Popen([sys.executable, "-c", RUN.format(sleepers=SLEEPERS)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline().strip() == "started"
    deadline = time.time() + 20
    while len(procs.processes_of(outer)) < 3 and time.time() < deadline:        # the run, its child, the grandchild
        time.sleep(0.1)
    assert len(procs.processes_of(outer)) == 3
    return p


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, None),
                                       (signal.SIGHUP, 128 + signal.SIGHUP)])
def test_a_run_stopped_by_a_signal_ends_every_process_it_started(sig, code):
    outer = f"pytest-{uuid.uuid4().hex[:8]}"
    p = _start(outer)
    try:
        p.send_signal(sig)
        rc = p.wait(timeout=60)         # seconds when idle; more on a machine loaded by a running experiment
        assert rc != 0 and (code is None or rc == code)
        assert procs.processes_of(outer) == []
    finally:
        procs.end_processes(outer)


def test_the_next_run_ends_what_a_killed_run_left():
    """SIGKILL leaves the runner no chance to clean up: its record in artifacts/.runs/ names a runner that is gone,
    and the next run (here: procs.end_orphaned_runs, what every run does first) ends its processes."""
    outer = f"pytest-{uuid.uuid4().hex[:8]}"
    p = _start(outer)
    try:
        mine = [r for r in procs.recorded_runs() if r.get("pid") == p.pid]
        assert len(mine) == 1 and mine[0]["alive"]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        left = procs.processes_of(outer)
        assert len(left) == 2                                                  # the child and grandchild live on
        ended = procs.end_orphaned_runs(quiet=True)
        assert set(left) <= set(ended) and procs.processes_of(outer) == []
        assert not [r for r in procs.recorded_runs() if r.get("pid") == p.pid]   # its record is gone too
    finally:
        procs.end_processes(outer)


def test_a_live_runs_processes_are_left_alone():
    outer = f"pytest-{uuid.uuid4().hex[:8]}"
    p = _start(outer)
    try:
        procs.end_orphaned_runs(quiet=True)
        assert len(procs.processes_of(outer)) == 3
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        procs.end_processes(outer)
