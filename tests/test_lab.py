"""`make lab`: JupyterLab on copies of the notebooks prepared for one profile (ci by default), with the Makefile's
environment, writing nothing the repository tracks."""
from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import nbformat
import pytest

from lib.compendium import lab, procs
from lib.compendium.params import stages, validate_profile


def test_the_copies_carry_the_chosen_profiles_parameters_and_keep_edits(tmp_path):
    nbs = lab.prepare("ci", dest=tmp_path)
    assert [p.name for p in nbs] == [s.notebook.name for s in stages() if s.notebook is not None]
    ci = validate_profile("ci")
    for p in nbs:
        cell = next(c for c in nbformat.read(str(p), as_version=4).cells
                    if "injected-parameters" in c.metadata.get("tags", []))
        assert 'profile = "ci"' in cell.source, p.name
    first = nbformat.read(str(nbs[0]), as_version=4)
    inj = next(c for c in first.cells if "injected-parameters" in c.metadata.get("tags", []))
    assert f"memeworld_n = {ci['00_data_prep']['memeworld_n']}" in inj.source         # ci's sizes, not embedded's
    nbs[0].write_text(nbs[0].read_text().replace("Data preparation", "Data preparation (my edit)"))
    lab.prepare("ci", dest=tmp_path)
    assert "(my edit)" in nbs[0].read_text()                                            # an edited copy is kept
    lab.prepare("ci", dest=tmp_path, fresh=True)
    assert "(my edit)" not in nbs[0].read_text()


def test_the_command_has_the_makefiles_environment():
    cmd, env = lab.command("ci", browser=False)
    assert cmd[1:3] == ["-m", "jupyterlab"] and "--no-browser" in cmd
    assert any("artifacts/ci/lab" in c for c in cmd)
    for k in ("HF_HUB_OFFLINE", "PYTHONHASHSEED", "MPLBACKEND"):
        assert env.get(k), k
    assert env["COMPENDIUM_LAB_PROFILE"] == "ci"


def test_jupyterlab_starts_on_the_copies(tmp_path):
    """The server `make lab` starts answers and lists the prepared notebooks (then it is ended, with its kernels)."""
    lab.prepare("ci", dest=tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd, env = lab.command("ci", port=port, browser=False, notebook_dir=tmp_path)
    run_id = f"pytest-lab-{port}"
    env[procs.RUN_IDS_ENV] = run_id
    p = subprocess.Popen(cmd + ["--IdentityProvider.token=t", "--ServerApp.password="], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, listing = time.time() + 90, None
        while time.time() < deadline and p.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token=t", timeout=2) as r:
                    listing = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "jupyter lab did not answer"
        names = {c["name"] for c in listing["content"]}
        assert "00_data_prep.ipynb" in names and "07_figures.ipynb" in names
    finally:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
        procs.end_processes(run_id)


def test_make_lab_defaults_to_the_ci_profile():
    out = subprocess.run(["make", "-n", "lab"], capture_output=True, text=True, cwd=lab.ROOT).stdout
    assert "lib.compendium.lab --profile ci" in out
    out = subprocess.run(["make", "-n", "lab", "PROFILE=embedded"], capture_output=True, text=True, cwd=lab.ROOT).stdout
    assert "lib.compendium.lab --profile embedded" in out
